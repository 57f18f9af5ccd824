"""The bundle's reader-facing files, without running a protocol: ``evidence.md`` rendered from real
bundles' ``evidence.json`` must be the text the hand-built renderer wrote for them, and
``field evidence check`` reads ``evidence.json`` through the shared document reader.

The fixtures under ``data/evidence_md/`` are three real bundles (a passing run with three kills, one
inside a save; a run diverging after its resume; a protocol whose runs did not finish), each with
the ``evidence.md`` written before the page became a Jinja2 template.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jinja2
import pytest

from lightning_field.evidence.bundle import write_bundle
from lightning_field.evidence.bundle_format import EVIDENCE_DOCUMENT, EVIDENCE_JSON, EVIDENCE_MD
from lightning_field.evidence.check import check_bundle
from lightning_field.evidence.markdown import render_markdown

FIXTURES = Path(__file__).parent / "data" / "evidence_md"
BUNDLES = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())


def test_the_fixtures_cover_a_pass_a_divergence_and_an_incomplete_protocol() -> None:
    verdicts = {json.loads((FIXTURES / name / EVIDENCE_JSON).read_text())["summary"].split(":")[0] for name in BUNDLES}
    assert len(BUNDLES) == 3 and verdicts == {"exact", "fail"}


@pytest.mark.parametrize("name", BUNDLES)
def test_evidence_md_renders_byte_for_byte_as_before(name: str) -> None:
    evidence = json.loads((FIXTURES / name / EVIDENCE_JSON).read_text())
    assert render_markdown(evidence).encode() == (FIXTURES / name / EVIDENCE_MD).read_bytes()


@pytest.mark.parametrize("name", BUNDLES)
@pytest.mark.filterwarnings("ignore:No artists with labels found")  # no series given: the plots are empty
def test_write_bundle_publishes_that_page_and_the_record_last(name: str, tmp_path: Path) -> None:
    evidence = json.loads((FIXTURES / name / EVIDENCE_JSON).read_text())
    write_bundle(evidence, {"series": {}, "deltas": {}, "kills": {}}, tmp_path)
    assert (tmp_path / EVIDENCE_MD).read_bytes() == (FIXTURES / name / EVIDENCE_MD).read_bytes()
    assert json.loads((tmp_path / EVIDENCE_JSON).read_text()) == evidence


def test_a_record_lacking_a_key_the_page_shows_fails_to_render_instead_of_printing_a_blank() -> None:
    evidence = json.loads((FIXTURES / BUNDLES[0] / EVIDENCE_JSON).read_text())
    del evidence["population"]["denominator"]
    with pytest.raises(jinja2.UndefinedError, match="denominator"):
        render_markdown(evidence)


def test_check_names_a_missing_an_unreadable_and_a_future_bundle(tmp_path: Path) -> None:
    ok, reasons = check_bundle(tmp_path / "nowhere", None)
    assert not ok and reasons[0].startswith("evidence missing: ") and EVIDENCE_JSON in reasons[0]

    bundle = tmp_path / "bundle"
    shutil.copytree(FIXTURES / "fail_runs_incomplete", bundle)
    (bundle / EVIDENCE_JSON).write_text("{not json")
    ok, reasons = check_bundle(bundle, None)
    assert not ok and reasons[0].startswith("evidence unreadable: ") and "not valid JSON" in reasons[0]

    (bundle / EVIDENCE_JSON).write_text(json.dumps({"format": "lightning_field.evidence/99"}))
    ok, reasons = check_bundle(bundle, None)
    assert not ok and "unsupported evidence bundle format 'lightning_field.evidence/99'" in reasons[0]
    assert all(repr(f) in reasons[0] for f in EVIDENCE_DOCUMENT.readable)

    (bundle / EVIDENCE_JSON).write_text(json.dumps({"format": EVIDENCE_DOCUMENT.current, "summary": "x"}))
    ok, reasons = check_bundle(bundle, None)
    assert not ok and "lacks required field(s) gate, tested_configuration, artifacts" in reasons[0]


def test_a_failed_gate_is_a_reason_naming_the_failed_conditions(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "fail_divergent_step", tmp_path / "bundle")
    ok, reasons = check_bundle(tmp_path / "bundle", None)
    assert not ok and reasons[0].startswith("the evidence's own gate failed (verdict_not_fail)")
