"""Straggler, collective and input-pipeline profiling; effective FLOP/s and MFU."""

from __future__ import annotations

from lightning_field.profiling.comm import CommTimer, ProfiledDDPStrategy, bus_bandwidth
from lightning_field.profiling.straggler import Flag, StragglerMonitor, StragglerReport

__all__ = ["CommTimer", "Flag", "ProfiledDDPStrategy", "StragglerMonitor", "StragglerReport", "bus_bandwidth"]
