"""The release record: assembled from a real run, held on a critical failure or stale evidence, signed,
rendered, logged to W&B; and the condition, ladder and signing logic on synthetic records.

One real run is made per module (field-train with drills, profiling, time to quality and W&B offline;
field-evidence on the same workload; field preflight), in a project directory under git so the code
identity is the project's and does not move while others edit this repository. The failing and stale
variants are copies of it with one file edited, as the test names say.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import child_env, python_program

from lightning_field.cli.main import main as field_main
from lightning_field.record.build import signature_state
from lightning_field.record.check import check_record
from lightning_field.record.conditions import decide, evaluate_conditions
from lightning_field.record.config import RecordConfigError, load_record_config, parse_record_config
from lightning_field.record.html import render_html
from lightning_field.record.identity import staleness_reasons
from lightning_field.record.ladder import exposure
from lightning_field.record.signing import content_sha256, sign, verify_signatures
from lightning_field.state.provenance_compare import stable_hash

REPO = Path(__file__).resolve().parent.parent


def chromium() -> str:
    """The headless browser; CI (``.ci/run`` sets LIGHTNING_FIELD_REQUIRE_BROWSER) fails without one
    rather than skipping, so the rendering is always proven where it counts."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("LIGHTNING_FIELD_REQUIRE_BROWSER"):
            pytest.fail("no chromium on PATH, and this run requires the rendering test (.ci/install installs it)")
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium)")
    return found


NEWEST = "epoch=1-step=60"


def field(*args: str) -> tuple[int, str]:
    """``field ARGS`` in this process (no interpreter start-up), with its stdout and stderr."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            rc = field_main([str(a) for a in args])
        except SystemExit as exit_:  # argparse
            rc = int(exit_.code or 0)
    return rc, out.getvalue()


def _env() -> dict[str, str]:
    env = child_env()
    # The children import this checkout, wherever the editable install points.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env.update(WANDB_MODE="offline", WANDB_SILENT="true")
    return env


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """A released run with passing resume evidence and a preflight, made by the real commands at once."""
    root = tmp_path_factory.mktemp("record")
    project = root / "project"
    project.mkdir()
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    (project / "README.md").write_text("the user's project\n")
    for cmd in (["init", "-q"], ["add", "README.md"], ["commit", "-qm", "init"]):
        subprocess.run([*git, *cmd], cwd=project, check=True)
    run = root / "outputs" / "field-train" / "demo"
    bundle = run / "field" / "evidence" / "demo"
    py = [python_program(), "-m"]
    commands = {
        "train": [*py, "lightning_field.cli.train_app", "experiment=demo", "progress_bar=none",
                  "trainer.enable_model_summary=false", f"paths.root_dir={root}", "logger=wandb",
                  "callbacks=[checkpoint,time_to_quality,straggler_monitor,restore_drill]",
                  "callbacks.checkpoint.save_top_k=-1", "callbacks.checkpoint.interrupts.save_on_train_end=true",
                  f"callbacks.checkpoint.code_dir={project}", "callbacks.restore_drill.every_n_checkpoints=5",
                  "callbacks.straggler_monitor.report_interval_s=0.05", "callbacks.time_to_quality.deadline_hours=1",
                  "callbacks.time_to_quality.price_per_device_hour=2.5"],
        "evidence": [*py, "lightning_field.cli.evidence_app", f"hydra.run.dir={root / 'evidence_hydra'}",
                     f"evidence.bundle_dir={bundle}", "evidence.steps=10", f"callbacks.checkpoint.code_dir={project}"],
        "preflight": [*py, "lightning_field.cli.preflight_app", "experiment=demo", f"paths.root_dir={root}",
                      "preflight.sample_batches=4", "preflight.baseline_steps=5"],
    }  # fmt: skip
    procs = {
        name: subprocess.Popen(cmd, cwd=root, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for name, cmd in commands.items()
    }
    try:
        outputs = {name: p.communicate(timeout=240)[0] for name, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    for name, p in procs.items():
        assert p.returncode == 0, f"{name} exited {p.returncode}:\n{outputs[name][-3000:]}"
    preflight = root / "outputs" / "field-preflight" / "demo"
    good = root / "rec_good"
    rc, out = field("record", "build", run, preflight, "--out", good, "--no-wandb")
    assert rc == 0, out
    yield {"root": root, "run": run, "bundle": bundle, "preflight": preflight, "good": good}


def _load(record_dir: Path) -> dict:
    return json.loads((record_dir / "record.json").read_text())


def _status(record: dict) -> dict[str, str]:
    return {c["name"]: c["status"] for c in record["conditions"]}


# ---------------------------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_a_record_from_a_run_with_passing_evidence_checks_out_and_every_figure_cites_its_source(
    made: dict[str, Path],
) -> None:
    rc, out = field("record", "check", made["good"])
    assert rc == 0, out
    assert "GO" in out
    record = _load(made["good"])
    status = _status(record)
    assert record["decision"]["verdict"] == "go"
    assert {status[n] for n in ("resume_evidence", "newest_checkpoint_recoverable", "checkpoint_restore_tested")} == {
        "pass"
    }
    assert status["preflight"] == "pass" and status["no_stragglers"] == "pass" and status["deadline"] == "pass"
    assert record["release"]["run_dir"] == str(made["run"]) and record["release"]["checkpoint"] == NEWEST
    kinds = {s["kind"] for s in record["sources"]}
    assert {"checkpoint", "evidence", "profile", "events", "time_to_quality", "preflight"} <= kinds
    for figure in record["figures"]:
        for key in ("source", "config_hash", "code_version", "date", "population", "denominator", "limitations"):
            assert key in figure, (figure["id"], key)
        assert figure["source"]["digest"].startswith("blake3:") and len(figure["source"]["digest"]) == 7 + 64
        assert Path(figure["source"]["path"]).is_file()
        assert figure["population"] and figure["denominator"] and figure["date"]
    # linked and hashed, not copied, by default
    assert not (made["good"] / "sources").exists() and all(s["copied_to"] is None for s in record["sources"])
    evidence = next(f for f in record["figures"] if f["name"] == "resume_evidence")
    assert evidence["value"]["verdict"] == "exact" and evidence["code_version"].startswith(
        record["release"]["identity"]["code.git_commit"][:12]
    )
    assert {p["file"] for p in record["plots"]} >= {"quality.png", "goodput.png", "throughput.png"}


@pytest.mark.slow
def test_a_failing_resume_bundle_holds_the_release_even_when_every_advisory_figure_is_favourable(
    made: dict[str, Path],
) -> None:
    run = made["root"] / "run_failing_evidence"
    shutil.copytree(made["run"], run)
    path = run / "field" / "evidence" / "demo" / "evidence.json"
    evidence = json.loads(path.read_text())
    evidence.update(verdict="fail", summary="fail: interrupted-1 diverges at step 6 (weights)")
    evidence["gate"] = {**evidence["gate"], "passed": False, "failed": ["verdict_not_fail"]}
    for condition in evidence["critical_conditions"]:
        if condition["name"] == "verdict_not_fail":
            condition.update(passed=False, detail=evidence["summary"])
    path.write_text(json.dumps(evidence))
    # Only advisories with evidence: every one shown is favourable. The tiny run's goodput depends on
    # how loaded the machine was (start-up against a few seconds of training), so its bar is lowered.
    favourable = ["~record.conditions.scaling", "~record.conditions.multi_rank_resume_evidence",
                  "~record.conditions.multi_node_resume_evidence", "record.ladder.one-node.requires=[no_stragglers]",
                  "record.ladder.n-nodes.requires=[]", "record.conditions.goodput.params.min_goodput=0.0"]  # fmt: skip
    out_dir = made["root"] / "rec_failing"
    rc, out = field("record", "build", run, made["preflight"], "--out", out_dir, "--no-wandb", *favourable)
    assert rc == 0, out
    record = _load(out_dir)
    advisories = [c for c in record["conditions"] if c["severity"] == "advisory"]
    assert advisories and all(c["status"] == "pass" for c in advisories)
    assert _status(record)["resume_evidence"] == "fail"
    rc, out = field("record", "check", out_dir)
    assert rc == 1, out
    assert "HOLD" in out and "resume_evidence is fail" in out and "verdict 'fail'" in out
    assert record["exposure"]["supported"] is None


@pytest.mark.slow
def test_after_the_learning_rate_changes_the_evidence_is_stale_and_the_decision_held(made: dict[str, Path]) -> None:
    """The released run is the same run relaunched with lr 0.02: its manifests say so; the evidence is for 0.01."""
    run = made["root"] / "run_lr_changed"
    shutil.copytree(made["run"], run)
    for manifest_path in (run / "checkpoints").glob("*/manifest.json"):
        manifest = json.loads(manifest_path.read_text())
        config = manifest["provenance"]["config"]
        config["resolved"]["model"]["lr"] = 0.02
        config["hash"] = stable_hash(config["resolved"])
        manifest_path.write_text(json.dumps(manifest))
    out_dir = made["root"] / "rec_stale"
    rc, out = field("record", "build", run, made["preflight"], "--out", out_dir, "--no-wandb")
    assert rc == 0, out
    condition = next(c for c in _load(out_dir)["conditions"] if c["name"] == "resume_evidence")
    assert condition["status"] == "stale" and not condition["passed"]
    assert "model.lr: evidence 0.01, released 0.02" in condition["detail"]
    rc, out = field("record", "check", out_dir)
    assert rc == 1 and "resume_evidence is stale" in out, out


@pytest.mark.slow
def test_signing_then_editing_one_figure_invalidates_the_signature_and_check_says_so(made: dict[str, Path]) -> None:
    record_dir = made["root"] / "rec_signed"
    shutil.copytree(made["good"], record_dir)
    for role, name in (("model-owner", "Ada"), ("data-owner", "Grace"), ("training-operator", "Linus")):
        rc, out = field("record", "sign", record_dir, "--role", role, "--name", name, "--note", "reviewed")
        assert rc == 0, out
    rc, out = field("record", "check", record_dir)
    assert rc == 0 and out.count("signature: valid") == 3, out
    record = _load(record_dir)
    goodput = next(f for f in record["figures"] if f["name"] == "goodput")
    goodput["value"] = 0.99  # one figure, edited by hand
    (record_dir / "record.json").write_text(json.dumps(record, indent=2))
    rc, out = field("record", "check", record_dir)
    assert rc == 1, out
    assert out.count("is INVALID: the record changed after it was signed") == 3
    assert "edited after it was built" in out


@pytest.mark.slow
def test_enforced_sign_off_holds_until_model_data_owners_and_the_operator_have_signed(made: dict[str, Path]) -> None:
    record_dir = made["root"] / "rec_enforced"
    rc, out = field("record", "build", made["run"], made["preflight"], "--out", record_dir, "--no-wandb",
                    "record.signoff.enforce=true")  # fmt: skip
    assert rc == 0, out
    for role in ("model-owner", "data-owner"):
        assert field("record", "sign", record_dir, "--role", role, "--name", "someone")[0] == 0
    rc, out = field("record", "check", record_dir)
    assert rc == 1 and "restart_procedure: awaiting sign-off by training-operator" in out, out
    assert field("record", "sign", record_dir, "--role", "training-operator", "--name", "op")[0] == 0
    assert field("record", "check", record_dir)[0] == 0


@pytest.mark.slow
def test_the_html_page_is_self_contained_and_renders_with_its_plots_in_headless_chromium(
    made: dict[str, Path], tmp_path: Path
) -> None:
    from PIL import Image

    page = made["good"] / "record.html"
    text = page.read_text()
    assert text.count("data:image/png;base64,") >= 5  # three of the record's, the evidence's loss and divergence
    assert "http://" not in text and "https://" not in text and "<script" not in text
    browser = chromium()
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp_path / 'profile'}", f"--screenshot={shot}", "--window-size=1200,2000",
         page.as_uri()],
        capture_output=True, text=True, timeout=90,
    )  # fmt: skip
    assert shot.is_file(), proc.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1200, 2000)
    pixels = list(image.getdata())
    non_white = sum(1 for r, g, b in pixels if min(r, g, b) < 235)
    assert non_white / len(pixels) > 0.03, f"{non_white} non-white pixels: blank page?"
    # The GO badge is green and the quality plot's line blue: the page was laid out, plots included.
    assert any(g > 100 and r < 60 and b < 80 for r, g, b in pixels), "no GO badge"
    assert sum(1 for r, g, b in pixels if b > 150 and r < 60 and 90 < g < 150) > 50, "no plotted line"


@pytest.mark.slow
def test_a_name_or_path_holding_markup_is_text_on_the_page_never_markup(made: dict[str, Path]) -> None:
    record = _load(made["good"])
    hostile = "<script>alert('x')</script> & co"
    record["conditions"][0]["name"] = f"cond {hostile}"
    record["decision"]["held_by"] = [{"name": f"held {hostile}", "status": "fail", "detail": "d & <b>"}]
    record["sources"][0]["path"] = f"/runs/{hostile}/manifest.json"
    record["figures"][0]["label"] = f"figure {hostile}"
    record["config"]["note"] = hostile
    page = render_html(record, made["good"], signature_state(record))
    assert "<script" not in page and "& co" not in page and "d & <b>" not in page
    escaped = "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; co"
    for shown in (f"cond {escaped}", f"held {escaped}", f"/runs/{escaped}/manifest.json", f"figure {escaped}"):
        assert shown in page
    assert "d &amp; &lt;b&gt;" in page
    assert '"note": "&lt;script&gt;' in page.replace("&#34;", '"')  # the configuration, as JSON text


@pytest.mark.slow
def test_the_exposure_ladder_names_the_supported_level_and_what_the_next_one_lacks(made: dict[str, Path]) -> None:
    ladder = _load(made["good"])["exposure"]
    assert ladder["supported"] == "one-device" and "preflight" in ladder["why"]
    assert ladder["next"] == "one-node"
    lacks = {x["name"]: x["status"] for x in ladder["next_lacks"]}
    assert lacks == {"scaling": "missing", "multi_rank_resume_evidence": "missing"}
    _, out = field("record", "check", made["good"])
    assert "supported level one-device" in out and "next level one-node lacks: scaling (missing)" in out


@pytest.mark.slow
def test_wandb_offline_logs_the_record_artifact_and_the_verdict_into_the_run_summary(
    made: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from lightning_field.integrations import offline_segments, read_offline_run, read_wandb_identity

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = made["run"]
    before = offline_segments(run)
    rc, out = field("record", "build", run, made["preflight"], "--out", made["root"] / "rec_wandb")
    assert rc == 0 and "W&B: artifact release-record-" in out, out
    import wandb

    wandb.teardown()  # wandb 0.31 finishes writing the transaction log in its service process
    segments = offline_segments(run)
    assert len(segments) == len(before) + 1  # one more segment of the same run, for `field wandb sync`
    logged = read_offline_run(segments[-1])
    assert logged["run_id"] == read_wandb_identity(run)["run_id"]
    assert logged["summary"]["field/record/verdict"] == "go"
    assert logged["summary"]["field/record/exposure_level"] == "one-device"
    (artifact,) = [a for a in logged["artifacts"] if a["type"] == "release-record"]
    assert {"record.json", "record.html", "quality.png"} <= set(artifact["files"])
    assert artifact["metadata"]["verdict"] == "go" and artifact["metadata"]["conditions"]["resume_evidence"] == "pass"


@pytest.mark.slow
def test_copy_keeps_the_sources_in_the_record_and_a_changed_linked_source_holds_the_check(
    made: dict[str, Path],
) -> None:
    run = made["root"] / "run_changed_later"
    shutil.copytree(made["run"], run, ignore=shutil.ignore_patterns("wandb"))
    linked, copied = made["root"] / "rec_linked", made["root"] / "rec_copied"
    assert field("record", "build", run, "--out", linked, "--no-wandb")[0] == 0
    assert field("record", "build", run, "--out", copied, "--no-wandb", "--copy")[0] == 0
    assert all((copied / s["copied_to"]).is_file() for s in _load(copied)["sources"])
    with open(run / "field" / "evidence" / "demo" / "evidence.json", "a") as f:
        f.write("\n")  # the evidence the record cites is no longer the evidence on disk
    rc, out = field("record", "check", linked)
    assert rc == 1 and "changed since the build" in out and "cited by a critical condition" in out, out
    assert field("record", "check", copied)[0] == 0
    # By default the record goes into the released run; a rebuild there never cites the copies it made.
    first = field("record", "build", run, "--no-wandb", "--copy")
    again = field("record", "build", run, "--no-wandb", "--copy")
    assert first[0] == again[0] == 0
    in_run = _load(run / "field" / "record")
    assert len(in_run["sources"]) == len(_load(copied)["sources"])
    assert not any("/field/record/" in s["path"] for s in in_run["sources"])


def _sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _as_format_1_evidence(bundle: Path) -> None:
    """Rewrite a bundle as the SHA-256 version wrote it (``manifest_sha256``, a bare hex digest)."""
    evidence = json.loads((bundle / "evidence.json").read_text())
    evidence["format"] = "lightning_field.evidence/1"
    for entry in evidence["tested_configuration"]["manifests"]:
        del entry["manifest_digest"]
        entry["manifest_sha256"] = _sha256_of(bundle / entry["manifest"])
    (bundle / "evidence.json").write_text(json.dumps(evidence, indent=2))


def _as_format_1_record(record_dir: Path) -> None:
    """Rewrite a record as the SHA-256 version wrote it: ``sha256`` per source, figure and plot."""
    record = _load(record_dir)
    record["format"] = "lightning_field.record/1"
    paths = {s["id"]: Path(s["path"]) for s in record["sources"]}
    for entry in record["sources"]:
        del entry["digest"]
        entry["sha256"] = _sha256_of(Path(entry["path"]))
    for figure in record["figures"]:
        figure["source"].pop("digest")
        figure["source"]["sha256"] = _sha256_of(paths[figure["source"]["id"]])
    for plot in record["plots"]:
        plot.pop("digest")
        file = Path(plot["file"]) if Path(plot["file"]).is_absolute() else record_dir / plot["file"]
        plot["sha256"] = _sha256_of(file)
    record["content_sha256"] = content_sha256(record)
    (record_dir / "record.json").write_text(json.dumps(record, indent=2))


@pytest.mark.slow
def test_evidence_and_records_written_with_sha256_still_check_and_still_catch_a_changed_file(
    made: dict[str, Path],
) -> None:
    run = made["root"] / "run_format_1"
    shutil.copytree(made["run"], run, ignore=shutil.ignore_patterns("wandb"))
    bundle = run / "field" / "evidence" / "demo"
    _as_format_1_evidence(bundle)
    rc, out = field("evidence", "check", bundle)
    assert rc == 0, out
    record_dir = made["root"] / "rec_format_1"
    assert field("record", "build", run, "--out", record_dir, "--no-wandb")[0] == 0
    _as_format_1_record(record_dir)
    assert any(s["kind"] == "evidence" for s in _load(record_dir)["sources"])
    rc, out = field("record", "check", record_dir)
    assert rc == 0 and "GO" in out, out

    manifest_copy = bundle / json.loads((bundle / "evidence.json").read_text())["tested_configuration"]["manifests"][0][
        "manifest"
    ]
    manifest_copy.write_text(manifest_copy.read_text().replace('"step"', '"step" ', 1))
    rc, out = field("evidence", "check", bundle)
    assert rc == 1 and "evidence altered" in out and "does not match its recorded hash" in out, out
    with open(bundle / "evidence.json", "a") as f:
        f.write("\n")  # a source the record cites by its SHA-256
    rc, out = field("record", "check", record_dir)
    assert rc == 1 and "changed since the build" in out, out


@pytest.mark.slow
def test_evidence_that_ages_past_its_maximum_holds_a_later_check(made: dict[str, Path]) -> None:
    later = time.time() + 721 * 3600  # resume_evidence allows 720 h
    result = check_record(made["good"], now=later)
    assert not result.ok and result.decision["held_by"][0]["name"] == "resume_evidence"
    assert "h old, the condition allows 720 h" in result.decision["held_by"][0]["detail"]


@pytest.mark.slow
def test_the_plan_stands_beside_what_was_measured_and_a_scaling_record_moves_the_ladder(
    made: dict[str, Path], tmp_path: Path
) -> None:
    inputs = ["--params", "577", "--tokens", "1M", "--devices", "1", "--device-tflops", "0.001", "--save-seconds",
              "0.02", "--mtbf-hours", "6", "--price-per-device-hour", "2.5"]  # fmt: skip
    rc, printed = field("plan", *inputs, "--json")
    assert rc == 0
    plan = tmp_path / "plan.json"
    plan.write_text(printed)
    scale = tmp_path / "scale"
    scale.mkdir()
    (scale / "scale.json").write_text(json.dumps({  # the fields `field scale` writes that the record reads
        "config": {"steps": 8, "effective_batch": 16, "threshold": 0.7},
        "runs": [{"ranks": 1, "throughput_samples_s": 100.0, "efficiency": 1.0, "gradient": None},
                 {"ranks": 2, "throughput_samples_s": 190.0, "efficiency": 0.95, "gradient": {"passed": True}}],
        "verdict": {"decision": "add devices", "message": "add devices: 2 ranks run at 95% scaling efficiency"},
    }))  # fmt: skip
    out_dir = tmp_path / "rec"
    rc, out = field("record", "build", made["run"], made["preflight"], scale, "--plan", plan, "--out", out_dir,
                    "--no-wandb")  # fmt: skip
    assert rc == 0, out
    record = _load(out_dir)
    save = next(r for r in record["plan_vs_measured"] if r["quantity"] == "blocking checkpoint save")
    assert save["planned"] == 0.02 and save["measured"] > 0
    assert next(f for f in record["figures"] if f["name"] == "plan")["estimate"] is True
    assert _status(record)["scaling"] == "pass"
    assert [x["name"] for x in record["exposure"]["next_lacks"]] == ["multi_rank_resume_evidence"]
    assert "Plan next to what was measured" in (out_dir / "record.html").read_text()


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.slow
def test_bad_input_is_named_and_exits_2(made: dict[str, Path], tmp_path: Path) -> None:
    rc, out = field("record", "build", tmp_path / "nowhere")
    assert rc == 2 and "not a directory" in out
    (tmp_path / "empty").mkdir()
    rc, out = field("record", "build", tmp_path / "empty")
    assert rc == 2 and "no sources found" in out
    rc, out = field("record", "build", made["run"], "--out", tmp_path / "r", "record.conditions.goodput.severity=often")
    assert rc == 2 and "record.conditions.goodput.severity" in out
    rc, out = field("record", "build", made["run"], "--out", tmp_path / "r", "record.conditions.goodput.check=vibes")
    assert rc == 2 and "record.conditions.goodput.check" in out
    rc, out = field("record", "sign", made["good"], "--role", "ceo", "--name", "x")
    assert rc == 2 and "unknown role 'ceo'" in out
    rc, out = field("record", "check", tmp_path / "empty")
    assert rc == 2 and "no record here" in out
    rc, out = field("record", "build", "--help")
    assert rc == 0 and "RUN_DIR|OVERRIDE" in out
    rc, out = field("record", "build", "--no-wandb", "--out", tmp_path / "opts_first", made["run"])
    assert rc == 0 and (tmp_path / "opts_first" / "record.json").is_file(), out


# ---------------------------------------------------------------------------------------------- synthetic
IDENTITY = {
    "code.git_commit": "c0ffee" * 6 + "abcd", "code.git_diff_hash": None, "code.lightning_field": "0.1.0",
    "code.torch": "2", "code.lightning": "2", "config.hash": "h", "data.fingerprint": "d",
    "model.architecture_hash": "m",
}  # fmt: skip
PROJECTION = {"model": {"lr": 0.01}, "data": {"size": 8}, "seed": 1}
NOW = 1_800_000_000.0


def _source(sid: str, projection: dict = PROJECTION, **identity: object) -> dict:
    """A source as ``collect`` writes it: its configuration hash is taken over the projection."""
    identity = {**IDENTITY, "config.hash": stable_hash(projection), **identity}
    return {"id": sid, "identity": identity, "config_projection": projection}


def _figure(name: str, value: object, sid: str, age_h: float = 1.0, path: str = "/run/x") -> dict:
    return {"id": f"{sid}.{name}", "name": name, "value": value, "source": {"id": sid, "path": path},
            "date_unix": NOW - age_h * 3600, "population": "p", "limitations": []}  # fmt: skip


def _evidence(verdict: str = "exact", passed: bool = True, world_size: int = 1) -> dict:
    return {"id": "b", "verdict": verdict, "summary": verdict, "gate_passed": passed, "gate_failed": [],
            "bundle_check_passed": True, "bundle_problems": [], "world_size": world_size}  # fmt: skip


RELEASE = {"run_dir": "/run", "identity": {**IDENTITY, "config.hash": stable_hash(PROJECTION)},
           "config_projection": PROJECTION}  # fmt: skip


def _evaluate(figures: list[dict], sources: list[dict], *overrides: str, release: dict = RELEASE) -> dict[str, dict]:
    config = load_record_config(overrides)
    results = evaluate_conditions(config.conditions, figures, {s["id"]: s for s in sources}, release, NOW)
    return {r["name"]: r for r in results}


def test_evidence_older_than_its_condition_allows_is_stale_and_stale_critical_evidence_holds() -> None:
    figures = [_figure("resume_evidence", _evidence(), "S1", age_h=30)]
    fresh = _evaluate(figures, [_source("S1")], "record.conditions.resume_evidence.max_age_hours=48")
    aged = _evaluate(figures, [_source("S1")], "record.conditions.resume_evidence.max_age_hours=24")
    assert fresh["resume_evidence"]["status"] == "pass"
    assert aged["resume_evidence"]["status"] == "stale" and "30.0 h old" in aged["resume_evidence"]["detail"]
    assert decide(list(aged.values()))["verdict"] == "hold"


def test_a_config_difference_is_stale_and_named_key_by_key_but_other_apps_config_hashes_do_not_matter() -> None:
    changed = {**PROJECTION, "model": {"lr": 0.03}}
    # The raw config hashes differ (two apps): only the projection over model/data/seed is compared.
    same = staleness_reasons({**IDENTITY, "config.hash": stable_hash(PROJECTION)}, PROJECTION,
                             {**IDENTITY, "config.hash": stable_hash(PROJECTION)}, PROJECTION, ["config"])  # fmt: skip
    assert same == []
    released = {**IDENTITY, "config.hash": stable_hash(PROJECTION)}
    evidence = {**IDENTITY, "config.hash": stable_hash(changed)}
    reasons = staleness_reasons(evidence, changed, released, PROJECTION, ["config", "code"])
    assert reasons == ["config differs (model.lr: evidence 0.03, released 0.01)"]
    outside_git = staleness_reasons({**IDENTITY, "code.git_commit": None}, PROJECTION, IDENTITY, PROJECTION, ["code"])
    assert any("code identity unknown" in r for r in outside_git)


def test_an_advisory_failure_is_shown_but_never_holds_and_a_missing_critical_one_always_does() -> None:
    figures = [_figure("resume_evidence", _evidence(), "S1"), _figure("goodput", 0.2, "S2")]
    results = _evaluate(figures, [_source("S1"), _source("S2")])
    assert results["goodput"]["status"] == "fail" and results["resume_evidence"]["status"] == "pass"
    decision = decide([results["goodput"], results["resume_evidence"]])
    assert decision["verdict"] == "go" and decision["advisories_not_met"] == [{"name": "goodput", "status": "fail"}]
    # the same advisory made critical on the command line holds
    critical = _evaluate(figures, [_source("S1"), _source("S2")], "record.conditions.goodput.severity=critical")
    assert decide(list(critical.values()))["verdict"] == "hold"
    # no checkpoint figure at all: the critical checkpoint conditions are missing, and hold
    assert critical["newest_checkpoint_recoverable"]["status"] == "missing"


def test_the_newest_fresh_bundle_decides_so_an_older_passing_one_cannot_mask_a_newer_failure() -> None:
    figures = [_figure("resume_evidence", _evidence(), "S1", age_h=5),
               _figure("resume_evidence", _evidence("fail", False), "S2", age_h=1)]  # fmt: skip
    result = _evaluate(figures, [_source("S1"), _source("S2")])["resume_evidence"]
    assert result["status"] == "fail" and result["figures"] == ["S2.resume_evidence"]
    # ...but a newer bundle of another configuration is stale and the older fresh one decides
    stale_new = [figures[0], _figure("resume_evidence", _evidence("fail", False), "S3", age_h=1)]
    other = _source("S3", projection={**PROJECTION, "seed": 2})
    assert _evaluate(stale_new, [_source("S1"), other])["resume_evidence"]["status"] == "pass"


def test_code_outside_git_makes_outside_evidence_stale_but_not_what_the_released_run_recorded_itself() -> None:
    release = {**RELEASE, "identity": {**RELEASE["identity"], "code.git_commit": None}}
    own = {**_source("S1", **{"code.git_commit": None}), "kind": "events", "path": "/run/field/events.jsonl"}
    bundle = {**_source("S2", **{"code.git_commit": None}), "kind": "evidence", "path": "/elsewhere/evidence.json"}
    figures = [_figure("goodput", 0.9, "S1"), _figure("resume_evidence", _evidence(), "S2")]
    results = _evaluate(figures, [own, bundle], release=release)
    assert results["goodput"]["status"] == "pass"
    assert (
        results["resume_evidence"]["status"] == "stale"
        and "code identity unknown" in results["resume_evidence"]["detail"]
    )


def test_the_ladder_is_cumulative_and_a_critical_failure_supports_no_level() -> None:
    config = load_record_config()

    def result(name: str, passed: bool, severity: str = "advisory") -> dict:
        status = "pass" if passed else "missing"
        return {"name": name, "severity": severity, "passed": passed, "status": status, "detail": status}

    passing = {c.name: result(c.name, True, c.severity) for c in config.conditions}
    passing["scaling"] = result("scaling", False)  # one-node lacks it; n-nodes' own requirement passes
    ladder = exposure(config.ladder, list(passing.values()))
    assert ladder["supported"] == "one-device" and ladder["next"] == "one-node"
    assert [x["name"] for x in ladder["next_lacks"]] == ["scaling"]
    assert not any(r["supported"] for r in ladder["levels"][1:])
    passing["resume_evidence"] = result("resume_evidence", False, "critical")
    held = exposure(config.ladder, list(passing.values()))
    assert held["supported"] is None and "resume_evidence" in held["why"]


def test_a_signature_covers_the_canonical_content_whatever_the_key_order_and_breaks_on_any_change() -> None:
    record = {"b": [1, {"y": 2, "x": 1}], "a": "é", "signatures": []}
    reordered = {"a": "é", "b": [1, {"x": 1, "y": 2}], "signatures": [{"role": "r"}]}
    assert content_sha256(record) == content_sha256(reordered)
    sign(record, "model-owner", "Ada", "ok", NOW)
    valid, problems = verify_signatures(record)
    assert len(valid) == 1 and not problems and record["signatures"][0]["time"].startswith("2027")
    record["b"][1]["x"] = 2
    valid, problems = verify_signatures(record)
    assert not valid and "Ada" in problems[0] and "INVALID" in problems[0]


def test_a_malformed_condition_configuration_names_the_key() -> None:
    raw = load_record_config().raw
    bad = json.loads(json.dumps(raw))
    bad["conditions"]["no_stragglers"]["params"]["last_n"] = 3
    with pytest.raises(RecordConfigError, match=r"no_stragglers\.params: unknown parameter\(s\) \['last_n'\]"):
        parse_record_config(bad)
    bad = json.loads(json.dumps(raw))
    bad["ladder"]["one-node"]["requires"] = ["nonexistent"]
    with pytest.raises(RecordConfigError, match=r"record\.ladder\.one-node\.requires names unknown"):
        parse_record_config(bad)
    with pytest.raises(RecordConfigError, match="max_age_hours"):
        load_record_config(["record.conditions.deadline.max_age_hours=-1"])
