"""The release record as a stored document: its file names, the formats written and read, and how it cites.

``build`` writes ``record.json``; ``check`` and ``sign`` read it back, possibly years later and with a
newer version. Both sides take the format from here, so what is written and what is readable cannot
drift apart, and reading goes through the envelope checks every versioned document shares
(``core.documents``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_field.core.documents import DocumentFormat
from lightning_field.core.hashing import recorded_digest

RECORD_JSON = "record.json"
"""Written last, like a manifest: its presence says the record is complete."""
RECORD_HTML = "record.html"

FORMAT = "lightning_field.record/2"
"""Format 2 cites every source and plot by its labelled digest (``digest``, ``"blake3:<hex>"``)."""

READABLE_FORMATS = ("lightning_field.record/1", FORMAT)
"""Format 1 records (``sha256``, a bare SHA-256 per source and plot) are still checked."""

# What `check` re-evaluates and `sign` re-renders: a record without one of these can be neither.
REQUIRED_FIELDS = (
    "created",
    "tool_version",
    "release",
    "decision",
    "exposure",
    "conditions",
    "signoff",
    "figures",
    "sources",
    "plots",
    "not_found",
    "limitations",
    "config",
)

RECORD_DOCUMENT = DocumentFormat(
    title="record",
    current=FORMAT,
    readable=READABLE_FORMATS,
    required=REQUIRED_FIELDS,
    missing_hint="field record build writes it",
)


def cited_digest(entry: Mapping[str, Any]) -> str:
    """A cited source's or plot's digest: labelled in format 2 (``digest``), a bare SHA-256 in format 1."""
    return recorded_digest(entry, "digest", "sha256")
