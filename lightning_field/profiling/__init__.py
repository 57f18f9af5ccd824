"""Straggler, collective and input-pipeline profiling; effective FLOP/s and MFU; the hang watchdog."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_field.core.lazy import lazy_exports

# Imported on first use: the profiling strategy and callback need Lightning; their readers do not.
_EXPORTS: dict[str, str] = {
    "CommTimer": "lightning_field.profiling.comm",
    "ProfiledDDPStrategy": "lightning_field.profiling.comm",
    "bus_bandwidth": "lightning_field.profiling.comm",
    "Flag": "lightning_field.profiling.straggler",
    "StragglerMonitor": "lightning_field.profiling.straggler",
    "StragglerReport": "lightning_field.profiling.straggler",
    "HANG_EXIT_CODE": "lightning_field.profiling.watchdog",
    "HangWatchdog": "lightning_field.profiling.watchdog",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from lightning_field.profiling.comm import CommTimer, ProfiledDDPStrategy, bus_bandwidth
    from lightning_field.profiling.straggler import Flag, StragglerMonitor, StragglerReport
    from lightning_field.profiling.watchdog import HANG_EXIT_CODE, HangWatchdog

__all__ = [
    "HANG_EXIT_CODE",
    "CommTimer",
    "Flag",
    "HangWatchdog",
    "ProfiledDDPStrategy",
    "StragglerMonitor",
    "StragglerReport",
    "bus_bandwidth",
]
