"""The release record: throughput, quality and recovery evidence in one signed bundle, with the
conditions that hold the release decision and the exposure level the evidence supports."""

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
