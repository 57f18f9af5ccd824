"""The release record: throughput, quality and recovery evidence in one signed bundle, with the
conditions that hold the release decision and the exposure level the evidence supports."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_field.core.lazy import lazy_exports

# Imported on first use: `field record check` reads a JSON record and must not import what building one
# needs.
_EXPORTS: dict[str, str] = {
    "build_record": "lightning_field.record.build",
    "CheckResult": "lightning_field.record.check",
    "check_record": "lightning_field.record.check",
    "load_record": "lightning_field.record.check",
    "CHECKS": "lightning_field.record.conditions",
    "decide": "lightning_field.record.conditions",
    "evaluate_conditions": "lightning_field.record.conditions",
    "RecordConfig": "lightning_field.record.config",
    "RecordConfigError": "lightning_field.record.config",
    "load_record_config": "lightning_field.record.config",
    "parse_record_config": "lightning_field.record.config",
    "FORMAT": "lightning_field.record.document",
    "exposure": "lightning_field.record.ladder",
    "content_sha256": "lightning_field.record.signing",
    "sign": "lightning_field.record.signing",
    "verify_signatures": "lightning_field.record.signing",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
    from lightning_field.record.build import build_record
    from lightning_field.record.check import CheckResult, check_record, load_record
    from lightning_field.record.conditions import CHECKS, decide, evaluate_conditions
    from lightning_field.record.config import RecordConfig, RecordConfigError, load_record_config, parse_record_config
    from lightning_field.record.document import FORMAT
    from lightning_field.record.ladder import exposure
    from lightning_field.record.signing import content_sha256, sign, verify_signatures

__all__ = [
    "CHECKS",
    "FORMAT",
    "CheckResult",
    "RecordConfig",
    "RecordConfigError",
    "build_record",
    "check_record",
    "content_sha256",
    "decide",
    "evaluate_conditions",
    "exposure",
    "load_record",
    "load_record_config",
    "parse_record_config",
    "sign",
    "verify_signatures",
]
