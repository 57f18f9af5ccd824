"""Resume evidence: the controlled comparison, the evidence bundle and its gate, and restore drills."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning_field.core.lazy import lazy_exports

# Imported on first use: `field evidence check` reads a bundle and hashes, and must not pay for torch
# and Lightning, which the protocol and the drills need.
_EXPORTS: dict[str, str] = {
    "build_evidence": "lightning_field.evidence.bundle",
    "write_bundle": "lightning_field.evidence.bundle",
    "check_bundle": "lightning_field.evidence.check",
    "EXACT": "lightning_field.evidence.compare",
    "FAIL": "lightning_field.evidence.compare",
    "WITHIN_NOISE": "lightning_field.evidence.compare",
    "RestoreDrill": "lightning_field.evidence.drill",
    "RestoreDrillError": "lightning_field.evidence.drill",
    "EvidenceConfigError": "lightning_field.evidence.protocol",
    "EvidenceSettings": "lightning_field.evidence.protocol",
    "run_protocol": "lightning_field.evidence.protocol",
    "StepTracer": "lightning_field.evidence.trace",
}

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

if TYPE_CHECKING:  # for type checkers and IDEs: the same names, imported eagerly
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
