"""Resume evidence: the controlled comparison, the evidence bundle and its gate, and restore drills."""

from __future__ import annotations

from lightning_field.evidence.bundle import build_evidence, write_bundle
from lightning_field.evidence.check import check_bundle
from lightning_field.evidence.compare import EXACT, FAIL, WITHIN_NOISE
from lightning_field.evidence.drill import RestoreDrill, RestoreDrillError
from lightning_field.evidence.protocol import EvidenceConfigError, EvidenceSettings, run_protocol
from lightning_field.evidence.trace import StepTracer

__all__ = [
    "EXACT",
    "FAIL",
    "WITHIN_NOISE",
    "EvidenceConfigError",
    "EvidenceSettings",
    "RestoreDrill",
    "RestoreDrillError",
    "StepTracer",
    "build_evidence",
    "check_bundle",
    "run_protocol",
    "write_bundle",
]
