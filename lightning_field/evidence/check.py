"""Does an evidence bundle support a recovery claim? The check behind ``field evidence check``.

A bundle supports a claim only when its own gate passed, its raw artifacts are all there and
unaltered, and, for a given checkpoint, that checkpoint is intact, recoverable, of an exact lineage
(no inexact resume, no Trainer setting changed on resume) and of the identity (code, config, data,
model) the evidence tested. Every reason it does not is returned, not raised:
the command and the release record list them all.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning_field.checkpoint.verify import verify_checkpoint
from lightning_field.core.documents import DocumentError, interpreting, read_document
from lightning_field.core.hashing import file_matches, recorded_digest
from lightning_field.core.manifest import ManifestError, read_manifest
from lightning_field.core.member_paths import UnsafeMemberError, check_member_name
from lightning_field.evidence.bundle_format import EVIDENCE_DOCUMENT, EVIDENCE_JSON
from lightning_field.evidence.identity import identity_differences, identity_of
from lightning_field.state.provenance_compare import diff_provenance, inexact_lineage

__all__ = ["check_bundle", "claim_problems"]


def _evidence_config(evidence: Mapping[str, Any], bundle_dir: Path) -> Mapping[str, Any] | None:
    """The config view the evidence runs recorded in their manifests (the bundle keeps copies)."""
    for entry in evidence["tested_configuration"].get("manifests", []):
        try:
            copy = json.loads((bundle_dir / entry["manifest"]).read_text())
        except (OSError, ValueError, KeyError):
            continue
        resolved = (copy.get("provenance", {}).get("config") or {}).get("resolved")
        if isinstance(resolved, Mapping):
            return resolved
    return None


def claim_problems(
    identity: Mapping[str, Any], checkpoint: Path, evidence_config: Mapping[str, Any] | None = None
) -> list[str]:
    """Why evidence with ``identity`` does not cover ``checkpoint`` (empty when it does). With the
    evidence's recorded config, a stale config names the keys that differ, not only the hash."""
    try:
        manifest = read_manifest(checkpoint)
    except ManifestError as err:
        return [str(err)]
    problems = []
    report = verify_checkpoint(checkpoint)
    if not report.intact:
        problems.append("the checkpoint is damaged: " + "; ".join(report.problems))
    elif not manifest.recoverable:
        problems.append("the checkpoint is not recoverable, it lacks: " + "; ".join(manifest.missing))
    problems += [f"the checkpoint's lineage is not exact: {reason}" for reason in inexact_lineage(manifest.provenance)]
    actual = identity_of(manifest.provenance)
    problems += [f"stale, {d}" for d in identity_differences(identity, actual)]
    saved = (manifest.provenance.get("config") or {}).get("resolved")
    if (
        evidence_config is not None
        and isinstance(saved, Mapping)
        and identity.get("config.hash") != actual.get("config.hash")
    ):
        for key, (before, after) in sorted(diff_provenance(evidence_config, saved).items()):
            problems.append(f"stale, config {key}: {before!r} (evidence) -> {after!r} (checkpoint)")
    if identity.get("code.git_commit") is None or actual.get("code.git_commit") is None:
        problems.append(
            "code identity unknown: the evidence or the checkpoint was made from code outside git, so nothing shows"
            " the two ran the same code"
        )
    return problems


def check_bundle(bundle_dir: Path, checkpoint: Path | None) -> tuple[bool, list[str]]:
    """Does the bundle support a recovery claim (for ``checkpoint``, when given)?

    Args:
        bundle_dir: the bundle directory, holding ``evidence.json``.
        checkpoint: a checkpoint the claim is about; None checks the bundle alone.

    Returns:
        (ok, reasons): ok only when ``reasons`` is empty. Nothing is raised for a missing, unreadable
        or failing bundle; each is a reason.

    Example::

        ok, reasons = check_bundle(Path("outputs/field/evidence/<id>"), Path("ckpts/epoch=0-step=500"))
    """
    path = bundle_dir / EVIDENCE_JSON
    try:
        evidence = read_document(path, EVIDENCE_DOCUMENT)
    except DocumentError as err:
        return False, [f"evidence {'unreadable' if path.is_file() else 'missing'}: {err}"]
    try:
        with interpreting(path):
            problems = _bundle_problems(evidence, bundle_dir, checkpoint)
    except (DocumentError, UnsafeMemberError) as err:
        return False, [f"evidence unreadable: {err}"]
    return not problems, problems


def _bundle_problems(evidence: Mapping[str, Any], bundle_dir: Path, checkpoint: Path | None) -> list[str]:
    """What keeps the read bundle from supporting the claim; a path it names outside the bundle is refused."""
    where = bundle_dir / EVIDENCE_JSON
    problems = []
    if not evidence["gate"]["passed"]:
        problems.append(
            f"the evidence's own gate failed ({', '.join(evidence['gate']['failed'])}): {evidence['summary']}"
        )
    for entry in evidence["tested_configuration"]["manifests"]:
        copy = bundle_dir / check_member_name(entry["manifest"], where)
        if not copy.is_file():
            problems.append(f"evidence incomplete: {entry['manifest']} is missing")
        elif not file_matches(copy, recorded_digest(entry, "manifest_digest", "manifest_sha256")):
            problems.append(f"evidence altered: {entry['manifest']} does not match its recorded hash")
    for run in evidence["artifacts"]["runs"].values():
        for rel in run["traces"]:
            if not (bundle_dir / check_member_name(rel, where)).is_file():
                problems.append(f"evidence incomplete: {rel} is missing")
    if checkpoint is not None:
        problems += claim_problems(
            evidence["tested_configuration"]["identity"], checkpoint, _evidence_config(evidence, bundle_dir)
        )
    return problems
