"""``field record check``: does a record still support the release, now?

Nothing in the record is taken on trust. The conditions are re-evaluated from its figures at the
time of the check (evidence ages out), every source it cites is re-hashed where it can be reached,
the content is compared with the stamp written at build time, and every signature is verified.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lightning_field.core.documents import interpreting, read_document
from lightning_field.core.hashing import file_matches
from lightning_field.core.member_paths import UnsafeMemberError, check_member_name
from lightning_field.record.conditions import GO, decide, evaluate_conditions
from lightning_field.record.config import parse_record_config
from lightning_field.record.document import RECORD_DOCUMENT, RECORD_JSON, cited_digest
from lightning_field.record.ladder import exposure
from lightning_field.record.signing import CONTENT_SHA256, content_sha256, missing_signoffs, verify_signatures


class RecordUnreadableError(ValueError):
    """The directory holds no readable record."""


@dataclass
class CheckResult:
    ok: bool
    decision: dict[str, Any]
    conditions: list[dict[str, Any]]
    exposure: dict[str, Any]
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    signatures: list[dict[str, Any]] = field(default_factory=list)


def load_record(record_dir: Path) -> dict[str, Any]:
    """The record in ``record_dir``, once its envelope checks (format, required fields).

    Raises:
        RecordUnreadableError: ``record_dir`` is not a directory, or its ``record.json`` is missing,
            not JSON, of a format this version cannot read, or lacks a field.
    """
    if not record_dir.is_dir():
        raise RecordUnreadableError(f"{record_dir}: no such directory")
    return read_document(record_dir / RECORD_JSON, RECORD_DOCUMENT, RecordUnreadableError)


def _source_problems(record: Mapping[str, Any], record_dir: Path) -> dict[str, str]:
    """source id -> why it no longer matches what the record cites."""
    problems = {}
    for source in record["sources"]:
        copied = source.get("copied_to")
        path = record_dir / check_member_name(copied, record_dir / RECORD_JSON) if copied else Path(source["path"])
        if not path.is_file():
            problems[source["id"]] = f"source {source['id']} ({source['kind']}) is gone: {path}"
        elif not file_matches(path, cited_digest(source)):
            problems[source["id"]] = f"source {source['id']} ({source['kind']}) changed since the build: {path}"
    for plot in record.get("plots", []):
        path = Path(plot["file"]) if Path(plot["file"]).is_absolute() else record_dir / plot["file"]
        if not path.is_file() or not file_matches(path, cited_digest(plot)):
            problems[f"plot:{plot['file']}"] = f"plot {plot['file']} is missing or changed since the build"
    return problems


def check_record(record_dir: Path, now: float | None = None) -> CheckResult:
    """Exit-status logic of ``field record check``, as data."""
    now = time.time() if now is None else now
    record = load_record(record_dir)
    with interpreting(record_dir / RECORD_JSON, RecordUnreadableError):
        try:
            return _check_loaded(record, record_dir, now)
        except UnsafeMemberError as err:
            raise RecordUnreadableError(str(err)) from None


def _check_loaded(record: Mapping[str, Any], record_dir: Path, now: float) -> CheckResult:
    problems: list[str] = []
    warnings: list[str] = []
    if record.get(CONTENT_SHA256) != content_sha256(record):
        problems.append(
            "record.json was edited after it was built: its content no longer matches its stamp"
            f" ({str(record.get(CONTENT_SHA256))[:16]}… at build, {content_sha256(record)[:16]}… now); rebuild it"
        )
    valid, invalid = verify_signatures(record)
    problems += invalid
    config = parse_record_config(record["config"])
    sources = {s["id"]: s for s in record["sources"]}
    results = evaluate_conditions(
        config.conditions, record["figures"], sources, record["release"], now, config.roles_for
    )
    built = {c["name"]: c["status"] for c in record["conditions"]}
    for r in results:
        if built.get(r["name"]) not in (None, r["status"]):
            warnings.append(f"{r['name']}: {built[r['name']]} at build, {r['status']} now ({r['detail']})")
    missing = missing_signoffs(record["signoff"]["bundles"], valid)
    decision = decide(results, missing if config.enforce_signoff else ())
    broken = _source_problems(record, record_dir)
    cited_by_critical = {fid.split(".", 1)[0] for r in results if r["severity"] == "critical" for fid in r["figures"]}
    for key, message in broken.items():
        if key in cited_by_critical:
            problems.append(message + " (cited by a critical condition)")
        else:
            warnings.append(message)
    if not config.enforce_signoff:
        warnings += missing
    ok = decision["verdict"] == GO and not problems
    return CheckResult(ok, decision, results, exposure(config.ladder, results), problems, warnings, valid)
