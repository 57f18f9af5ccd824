"""What the writer and the readers of an evidence bundle agree on: its file names and ``evidence.json``'s format.

The builder (``bundle.py``), the checker (``check.py``) and the readers outside this package (the
release record, the W&B artifact) take these from one place, so a bundle is found and its format
judged the same way by all of them.
"""

from __future__ import annotations

from lightning_field.core.documents import DocumentFormat

__all__ = [
    "DIVERGENCE_PLOT",
    "EVIDENCE_DOCUMENT",
    "EVIDENCE_JSON",
    "EVIDENCE_MD",
    "FORMAT",
    "LOSS_PLOT",
    "READABLE_FORMATS",
]

FORMAT = "lightning_field.evidence/2"
"""Format 2 records each manifest copy's labelled digest (``manifest_digest``, ``"blake3:<hex>"``)."""

READABLE_FORMATS = ("lightning_field.evidence/1", FORMAT)
"""Format 1 bundles (``manifest_sha256``, a bare SHA-256) are still checked."""

EVIDENCE_JSON = "evidence.json"
EVIDENCE_MD = "evidence.md"
LOSS_PLOT = "loss.png"
DIVERGENCE_PLOT = "divergence.png"

EVIDENCE_DOCUMENT = DocumentFormat(
    title="evidence bundle",
    current=FORMAT,
    readable=READABLE_FORMATS,
    # What checking a bundle reads before anything else; a file without them is no bundle of any format.
    required=("gate", "summary", "tested_configuration", "artifacts"),
    missing_hint=f"field-evidence writes {EVIDENCE_JSON} last, once the bundle is complete",
)
"""``evidence.json``'s envelope, for :func:`lightning_field.core.documents.read_document`."""
