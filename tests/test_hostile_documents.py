"""Every reader of a document others can write, fed generated malformed and hostile documents.

The only outcome allowed is a clean refusal naming the file (the reader's own error type, whose
message names the path) or a normal answer: never a traceback from deep inside, never a hang.
Over 10,000 documents in all under ``FIELD_FUZZ=full`` (the ``max_examples`` below); the envelope
(format, required keys) is usually right, so the generated values reach the code that interprets
the fields.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_field.checkpoint.freshness import FORMAT as FRESHNESS_FORMAT
from lightning_field.checkpoint.freshness import FRESHNESS_NAME, Freshness, StaleCheckpointError
from lightning_field.checkpoint.resolver import read_last_pointer
from lightning_field.checkpoint.snapshot_lineage import LINEAGE_NAME, lineage_mismatch
from lightning_field.checkpoint.stop_points import finished_detail
from lightning_field.checkpoint.stores import CheckpointStore, LocalStore
from lightning_field.checkpoint.tensor_file import MAGIC, TensorFileError
from lightning_field.checkpoint.tensor_file_reader import read_tensor_file
from lightning_field.checkpoint.verify import verify_checkpoint
from lightning_field.cli.main import main as field_main
from lightning_field.core.events import EventLogError, read_events
from lightning_field.core.layout import EVENTS_RELPATH
from lightning_field.core.manifest import MANIFEST_DOCUMENT, MANIFEST_NAME, Manifest, ManifestError, read_manifest
from lightning_field.core.signing import KEY_ENV, canonical_bytes, keys_from_environment
from lightning_field.evidence.bundle_format import EVIDENCE_DOCUMENT, EVIDENCE_JSON
from lightning_field.evidence.check import check_bundle
from lightning_field.quality.ledger import goodput_ledger
from lightning_field.record.check import RecordUnreadableError, check_record
from lightning_field.record.document import RECORD_DOCUMENT, RECORD_JSON
from lightning_field.record.errors import RecordConfigError
from lightning_field.state.provenance_compare import inexact_lineage
from lightning_field.state.trainer_settings import SETTINGS, changed_settings

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
pytestmark = pytest.mark.slow

# The whole suite feeds a 25th of the documents (about 480, a few seconds); `.ci/run` then runs this
# file alone with FIELD_FUZZ=full, all 16,900 of them, timed apart from the suite's budget.
FULL = os.environ.get("FIELD_FUZZ") == "full"


def fuzz(examples: int) -> settings:
    return settings(max_examples=examples if FULL else max(40, examples // 25), deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])  # fmt: skip


def documents(spec: Any, fields: dict[str, st.SearchStrategy[Any]] | None = None) -> st.SearchStrategy[bytes]:
    """Documents of ``spec``'s format with every required key, each holding generated JSON (or a
    plausible value from ``fields``), plus extra keys; now and then raw bytes or another format."""
    values = {key: (fields or {}).get(key, JSON) | JSON for key in spec.required}
    shaped = st.fixed_dictionaries({"format": st.just(spec.current), **values}, optional={"extra": JSON}).map(
        lambda d: json.dumps(d, default=str).encode()
    )
    return st.one_of(shaped, shaped, shaped, st.binary(max_size=64), JSON.map(lambda v: json.dumps(v).encode()))


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="hostile-") as directory:
        yield Path(directory)


def _written(scratch: Path, folder: str, name: str, raw: bytes) -> Path:
    """``raw`` as ``folder/name`` under ``scratch`` (reused from example to example); the folder."""
    directory = scratch / folder
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_bytes(raw)
    return directory


def _names_the_file(message: str, path: Path) -> None:
    assert str(path) in message, f"the refusal does not name {path}: {message}"


FILE_ENTRY = st.fixed_dictionaries(
    {"size": st.integers(0, 2**40) | JSON, "hash": st.text(max_size=8) | JSON, "rank": st.integers(0, 3) | JSON}
)
MANIFEST_FIELDS = {
    "files": st.dictionaries(st.sampled_from(["state.pt", "../x", "/etc/passwd", "a/b", ""]), FILE_ENTRY, max_size=3),
    "step": st.integers(-5, 2**63),
    "world_size": st.integers(-1, 8),
    "components": st.dictionaries(st.text(max_size=6), st.lists(st.integers(-1, 3) | JSON, max_size=3)),
    "recoverable": st.booleans(),
    "missing": st.lists(st.text(max_size=6) | JSON, max_size=3),
}


@fuzz(3000)
@given(raw=documents(MANIFEST_DOCUMENT, MANIFEST_FIELDS))
def test_a_hostile_manifest_is_refused_naming_it_by_every_reader(scratch: Path, raw: bytes) -> None:
    checkpoint = _written(scratch, "checkpoint", MANIFEST_NAME, raw)
    try:
        read_manifest(checkpoint)
    except ManifestError as err:
        _names_the_file(str(err), checkpoint)
    report = verify_checkpoint(checkpoint)
    assert report.manifest is not None or report.problems


@fuzz(400)
@given(raw=documents(MANIFEST_DOCUMENT, MANIFEST_FIELDS))
def test_field_ckpt_inspect_and_verify_answer_a_hostile_manifest_with_a_status(
    scratch: Path, raw: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = _written(scratch, "shown", MANIFEST_NAME, raw)
    assert field_main(["ckpt", "inspect", str(checkpoint)]) in (0, 1)
    assert field_main(["ckpt", "verify", "--quiet", str(checkpoint)]) in (0, 1)
    capsys.readouterr()


SETTING_VALUE = st.none() | st.booleans() | st.integers(-2, 8) | st.floats() | st.sampled_from(["32-true", "DDP"])
TRAINER_SETTINGS = st.dictionaries(st.sampled_from(SETTINGS), SETTING_VALUE | JSON, max_size=6) | JSON
STOPPED = st.fixed_dictionaries(
    {"by": st.sampled_from(["EarlyStopping", "max_time", "max_steps", "max_epochs", "should_stop"]) | JSON,
     "detail": st.text(max_size=12) | JSON, "finished": st.booleans() | JSON},
    optional={"epochs_done": st.integers(-1, 5) | JSON,
              "stopper": st.dictionaries(st.sampled_from(["elapsed_s", "patience", "state_key"]), JSON) | JSON},
) | JSON  # fmt: skip
CHANGED_SETTINGS = st.lists(
    st.fixed_dictionaries({"changes": st.dictionaries(st.sampled_from(SETTINGS), st.lists(JSON, max_size=3)) | JSON},
                          optional={"checkpoint": JSON, "step": JSON}) | JSON, max_size=3,
) | JSON  # fmt: skip


@fuzz(2000)
@given(
    stopped=STOPPED,
    provenance=st.fixed_dictionaries(
        {}, optional={"trainer": TRAINER_SETTINGS, "changed_settings": CHANGED_SETTINGS, "inexact_resume": JSON}
    ),
)
def test_a_hostile_stop_record_or_recorded_trainer_settings_are_refused_naming_the_manifest_or_read_safely(
    scratch: Path, stopped: Any, provenance: dict[str, Any]
) -> None:
    document = json.loads(Manifest("x", 6, 0, 1, {}, {}, True, []).to_json())
    document.update(stopped=stopped, provenance=provenance)
    checkpoint = _written(scratch, "stopped", MANIFEST_NAME, json.dumps(document, default=str).encode())
    try:
        manifest = read_manifest(checkpoint)
    except ManifestError as err:
        _names_the_file(str(err), checkpoint)
        return
    # What the resume and the evidence do with what was read: answers, never a crash.
    rerun = {"max_steps": 6, "max_epochs": 1, "max_time_s": [1.0], "early_stopping": [{"patience": 1}]}
    detail = finished_detail(manifest.stopped, manifest.step, rerun)
    assert detail is None or isinstance(detail, str)
    changed_settings(manifest.provenance.get("trainer") or {}, {"accumulate_grad_batches": 2, "world_size": 1})
    assert all(isinstance(reason, str) for reason in inexact_lineage(manifest.provenance))


@fuzz(1000)
@given(raw=st.binary(max_size=40) | st.sampled_from([b"../../etc\n", b"/\n", b"a/b\n", b"..\n", b"x\x00y\n"]))
def test_a_hostile_last_pointer_names_a_checkpoint_in_its_directory_or_nothing(scratch: Path, raw: bytes) -> None:
    (scratch / "LAST").write_bytes(raw)
    found = read_last_pointer(scratch)
    assert found is None or Path(found).parent == scratch


TOKEN = b"0123456789abcdef0123456789abcdef"


@fuzz(1000)
@given(
    theirs=st.binary(max_size=80) | st.sampled_from([TOKEN, TOKEN + b"\n", TOKEN.upper(), TOKEN + b"0", b"../x"]),
    ours=st.sampled_from([TOKEN, TOKEN + b"\n", b"", b"\xff" * 32]),
)
def test_a_hostile_run_token_lets_snapshots_resume_only_where_both_tokens_are_the_same_valid_one(
    scratch: Path, theirs: bytes, ours: bytes
) -> None:
    snapshots, checkpoints = scratch / "shm", scratch / "ckpts"
    snapshots.mkdir(exist_ok=True)
    checkpoints.mkdir(exist_ok=True)
    (snapshots / LINEAGE_NAME).write_bytes(theirs)
    (checkpoints / LINEAGE_NAME).write_bytes(ours)
    mismatch = lineage_mismatch(snapshots, cast(CheckpointStore, LocalStore()), checkpoints)
    same = theirs.strip() == TOKEN and ours.strip() == TOKEN
    assert (mismatch is None) == same, mismatch
    assert mismatch is None or str(snapshots) in mismatch


FRESHNESS_KEYS = keys_from_environment({KEY_ENV: "k1:a-long-enough-secret-for-tests-0123"})


def _signed_freshness(fields: dict[str, Any]) -> bytes:
    document = {"format": FRESHNESS_FORMAT, **fields}
    assert FRESHNESS_KEYS is not None
    document["signature"] = FRESHNESS_KEYS.sign(canonical_bytes(document))
    return json.dumps(document, default=str).encode()


@fuzz(1000)
@given(
    raw=st.binary(max_size=64)
    | st.fixed_dictionaries({"newest_step": JSON, "checkpoint": JSON}, optional={"signature": JSON}).map(
        lambda d: json.dumps({"format": FRESHNESS_FORMAT, **d}, default=str).encode()
    )
    | st.fixed_dictionaries({"newest_step": JSON | st.integers(-5, 2**70), "checkpoint": JSON}).map(_signed_freshness)
)
def test_a_hostile_freshness_record_is_a_step_it_signs_or_a_refusal_naming_it(scratch: Path, raw: bytes) -> None:
    folder = scratch / "fresh"
    folder.mkdir(exist_ok=True)
    (folder / FRESHNESS_NAME).write_bytes(raw)
    assert FRESHNESS_KEYS is not None
    try:
        step = Freshness(required=False).read(cast(CheckpointStore, LocalStore()), folder, FRESHNESS_KEYS)
    except StaleCheckpointError as err:
        _names_the_file(str(err), folder / FRESHNESS_NAME)
    else:
        assert isinstance(step, int) and not isinstance(step, bool) and step >= 0


@fuzz(2000)
@given(raw=documents(EVIDENCE_DOCUMENT))
def test_a_hostile_evidence_bundle_is_a_reason_naming_it_never_a_crash(scratch: Path, raw: bytes) -> None:
    bundle = _written(scratch, "bundle", EVIDENCE_JSON, raw)
    ok, reasons = check_bundle(bundle, None)
    assert ok is not True or not reasons
    for reason in reasons:
        if reason.startswith("evidence unreadable"):
            _names_the_file(reason, bundle)


@fuzz(2000)
@given(raw=documents(RECORD_DOCUMENT))
def test_a_hostile_release_record_is_refused_naming_it(scratch: Path, raw: bytes) -> None:
    record = _written(scratch, "record", RECORD_JSON, raw)
    try:
        check_record(record)
    except RecordConfigError:
        pass  # the record's own config section, refused with its field named
    except RecordUnreadableError as err:
        _names_the_file(str(err), record)


EVENT = st.fixed_dictionaries(
    {"event": st.sampled_from(["attempt_start", "attempt_end", "progress", "ckpt_load", "run_start",
                               "settings_changed"]) | JSON,
     "wall_time": st.floats(0, 2e9) | JSON, "attempt": st.integers(0, 3) | JSON},
    optional={"payload": st.dictionaries(st.sampled_from(["world_size", "seconds", "attempt", "step", "changes"]), JSON)
              | JSON, "step": st.integers(0, 100) | JSON},
)  # fmt: skip


@fuzz(2500)
@given(lines=st.lists(EVENT.map(lambda e: json.dumps(e, default=str)) | st.text(max_size=20), min_size=1, max_size=6))
def test_a_hostile_event_log_is_refused_naming_it_and_the_ledger_never_crashes(scratch: Path, lines: list[str]) -> None:
    log = scratch / EVENTS_RELPATH
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("\n".join(line.replace("\n", " ") for line in lines) + "\n")
    try:
        events = read_events(scratch)
    except EventLogError as err:
        _names_the_file(str(err), log)
        return
    try:
        goodput_ledger(events, now=2e9)
    except EventLogError as err:
        _names_the_file(str(err), log)
    except ValueError as err:
        assert "nothing to account for" in str(err)


TENSOR_ENTRY = st.lists(
    st.sampled_from(["float32", "int64", "bool", "object"]) | st.lists(st.integers(-2, 4), max_size=3)
    | st.integers(-8, 2**40) | JSON,
    min_size=6, max_size=6,
)  # fmt: skip
TREE = st.recursive(
    st.none() | st.integers(-3, 3) | st.text(max_size=4),
    lambda inner: st.tuples(st.sampled_from(["T", "d", "l", "t", "od", "ad", "b", "f", "np", "ns", "sz", "dt", "x"]),
                            inner | st.lists(inner, max_size=3)).map(list),
    max_leaves=10,
)  # fmt: skip


@fuzz(2000)
@given(
    header=st.fixed_dictionaries(
        {"format": st.just("lightning_field.tensors/1") | JSON, "byteorder": st.just("little") | JSON,
         "tensors": st.lists(TENSOR_ENTRY, max_size=3) | JSON, "tree": TREE | JSON}
    ),
    data=st.binary(max_size=96),
    claimed=st.none() | st.integers(0, 2**64 - 1),
)  # fmt: skip
def test_a_hostile_raw_tensor_file_is_refused_naming_it(scratch: Path, header: Any, data: bytes, claimed: Any) -> None:
    text = json.dumps(header, default=str).encode()
    length = len(text) if claimed is None else claimed
    path = _written(scratch, "tensors", "state.pt", MAGIC + length.to_bytes(8, "little") + text + data) / "state.pt"
    try:
        read_tensor_file(path)
    except TensorFileError as err:
        _names_the_file(str(err), path)
