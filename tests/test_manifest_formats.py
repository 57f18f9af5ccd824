"""Manifest format 2 hashes with BLAKE3; checkpoints of format 1 (SHA-256) still verify and resume."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import make_trainer

from lightning_field import latest_recoverable, read_manifest, verify_checkpoint
from lightning_field.cli.main import main as field_main
from lightning_field.core.manifest import DRILL_RECORD_NAME, FORMAT, MANIFEST_NAME, ManifestError, write_drill_record
from lightning_field.workloads.demo import DemoDataModule, DemoRegressor


def as_format_1(checkpoint: Path) -> None:
    """Rewrite a checkpoint's manifest as format 1 wrote it: the same layout, SHA-256 file hashes."""
    path = checkpoint / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    for name, entry in manifest["files"].items():
        entry["hash"] = hashlib.sha256((checkpoint / name).read_bytes()).hexdigest()
    manifest.update(format="lightning_field.checkpoint/1", hash_algorithm="sha256")
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True))


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.fixture
def run(tmp_path: Path) -> Path:
    trainer = make_trainer(tmp_path, 6, every_n_train_steps=3)
    trainer.fit(DemoRegressor(), datamodule=DemoDataModule(size=64))
    return tmp_path


def test_new_checkpoints_are_format_2_with_blake3_hashes_of_every_file(run: Path) -> None:
    checkpoint = run / "ckpts" / "epoch=0-step=3"
    manifest = read_manifest(checkpoint)
    assert manifest.format == FORMAT == "lightning_field.checkpoint/2" and manifest.hash_algorithm == "blake3"
    import blake3

    for name, entry in manifest.files.items():
        assert entry.hash == blake3.blake3((checkpoint / name).read_bytes()).hexdigest()


@pytest.mark.parametrize("fmt", [1, 2])
def test_a_flipped_byte_is_detected_under_either_format(run: Path, fmt: int) -> None:
    checkpoint = run / "ckpts" / "epoch=0-step=3"
    if fmt == 1:
        as_format_1(checkpoint)
    assert verify_checkpoint(checkpoint).intact
    _flip_a_byte(checkpoint / "state.pt")
    report = verify_checkpoint(checkpoint)
    assert not report.intact and any("state.pt: content hash" in p for p in report.problems), report.problems


def test_a_format_1_checkpoint_verifies_in_the_cli_and_resumes_bit_for_bit(
    run: Path, tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    # The uninterrupted reference: the same job straight to step 6.
    weights, step = _weights_after(run)
    assert step == 6
    interrupted = tmp_path_factory.mktemp("format1")
    shutil.copytree(run / "ckpts" / "epoch=0-step=3", interrupted / "ckpts" / "epoch=0-step=3")
    as_format_1(interrupted / "ckpts" / "epoch=0-step=3")
    assert field_main(["ckpt", "verify", str(interrupted / "ckpts" / "epoch=0-step=3")]) == 0
    assert field_main(["ckpt", "inspect", str(interrupted / "ckpts" / "epoch=0-step=3")]) == 0
    assert "lightning_field.checkpoint/1 (hashes: sha256)" in capsys.readouterr().out
    resumed_model = DemoRegressor()
    trainer = make_trainer(interrupted, 6, every_n_train_steps=3)
    trainer.fit(resumed_model, datamodule=DemoDataModule(size=64), ckpt_path="last")
    assert trainer.global_step == 6
    for name, tensor in resumed_model.state_dict().items():
        assert torch.equal(tensor, weights[name]), name
    # Its own later saves are format 2.
    latest = latest_recoverable(interrupted / "ckpts")
    assert latest is not None and read_manifest(latest).format == FORMAT


def _weights_after(run: Path) -> tuple[dict[str, torch.Tensor], int]:
    checkpoint = latest_recoverable(run / "ckpts")
    assert checkpoint is not None
    state = torch.load(checkpoint / "state.pt", weights_only=False)
    return state["state_dict"], state["global_step"]


def test_a_manifest_naming_the_wrong_algorithm_for_its_format_is_refused(run: Path) -> None:
    path = run / "ckpts" / "epoch=0-step=3" / MANIFEST_NAME
    manifest = json.loads(path.read_text())
    manifest["hash_algorithm"] = "sha256"  # format 2 with SHA-256: neither version wrote that
    path.write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=r"format 'lightning_field\.checkpoint/2' names hash algorithm 'sha256'"):
        read_manifest(path.parent)


@pytest.mark.parametrize("cores", [2, 8])
def test_a_save_hashes_with_blake3_threads_only_where_cores_are_free_and_the_digest_is_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cores: int
) -> None:
    import blake3

    from lightning_field.core import hashing
    from lightning_field.core.fsio import HashingWriter

    made: list[int] = []
    real = blake3.blake3

    def recording(*args: object, max_threads: int = 1, **kwargs: object) -> object:
        made.append(max_threads)
        return real(*args, max_threads=max_threads, **kwargs)

    monkeypatch.setattr(hashing, "available_cores", lambda: cores)
    monkeypatch.setattr(blake3, "blake3", recording)
    monkeypatch.setattr(blake3.blake3, "AUTO", real.AUTO, raising=False)
    data = torch.randint(0, 256, (8 << 20,), dtype=torch.uint8).numpy().tobytes()
    writer = HashingWriter(tmp_path / "f")
    writer.write(data)
    size, digest = writer.finish()
    assert made == [real.AUTO if cores >= 4 else 1]
    assert size == len(data) and digest == real(data).hexdigest() == hashing.hash_file(tmp_path / "f")[1]


def test_keys_a_later_writer_added_are_kept_when_a_manifest_is_read_and_written_again(run: Path) -> None:
    checkpoint = run / "ckpts" / "epoch=0-step=3"
    path = checkpoint / MANIFEST_NAME
    written = json.loads(path.read_text())
    written["snapshot_tier"] = {"kind": "peer", "partner_rank": 1}
    path.write_text(json.dumps(written))
    manifest = read_manifest(checkpoint)
    assert manifest.unknown_fields == {"snapshot_tier": {"kind": "peer", "partner_rank": 1}}
    manifest.write(checkpoint)
    rewritten = json.loads(path.read_text())
    assert rewritten == written and verify_checkpoint(checkpoint).recoverable


def test_a_drill_is_recorded_beside_the_manifest_which_keeps_its_committed_bytes(run: Path) -> None:
    checkpoint = run / "ckpts" / "epoch=0-step=3"
    committed = (checkpoint / MANIFEST_NAME).read_bytes()
    created = read_manifest(checkpoint).created_unix
    write_drill_record(checkpoint, {"outcome": "passed", "step": 3, "created_unix": created}, True)
    assert (checkpoint / MANIFEST_NAME).read_bytes() == committed
    manifest = read_manifest(checkpoint)
    assert manifest.restore_tested
    assert manifest.restore_drill == {"outcome": "passed", "step": 3, "created_unix": created}
    assert verify_checkpoint(checkpoint).recoverable  # the record is no payload of the checkpoint
    # A record left by an earlier checkpoint of this name (another commit time) is not this one's.
    write_drill_record(checkpoint, {"outcome": "passed", "step": 3, "created_unix": created - 60}, True)
    assert not read_manifest(checkpoint).restore_tested and read_manifest(checkpoint).restore_drill is None


def test_a_checkpoint_of_an_earlier_version_keeps_the_drill_its_manifest_holds(run: Path) -> None:
    checkpoint = run / "ckpts" / "epoch=0-step=3"
    path = checkpoint / MANIFEST_NAME
    written = json.loads(path.read_text())
    written.update(restore_tested=True, restore_drill={"outcome": "passed", "step": 3})
    path.write_text(json.dumps(written))
    assert not (checkpoint / DRILL_RECORD_NAME).exists()
    manifest = read_manifest(checkpoint)
    assert manifest.restore_tested and manifest.restore_drill == written["restore_drill"]


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("{not json", "restore drill record is not valid JSON"),
        ('{"format": "lightning_field.restore_drill/9", "restore_tested": true, "record": {}}', "restore_drill/9"),
        ('{"format": "lightning_field.restore_drill/1", "restore_tested": "yes", "record": {}}',
         "restore_tested must be true or false"),
        ('{"format": "lightning_field.restore_drill/1", "record": {}}', "restore_tested"),
    ],
)
def test_a_malformed_drill_record_is_refused_naming_its_file(run: Path, text: str, named: str) -> None:
    checkpoint = run / "ckpts" / "epoch=0-step=3"
    (checkpoint / DRILL_RECORD_NAME).write_text(text)
    with pytest.raises(ManifestError, match=re.escape(str(checkpoint / DRILL_RECORD_NAME))) as refused:
        read_manifest(checkpoint)
    assert named in str(refused.value)


@pytest.mark.parametrize(
    ("record", "named"),
    [
        ("every 5", "field 'snapshot_interval' is str"),
        ({"every_n_train_steps": "5", "reason": "r"}, "field 'snapshot_interval.every_n_train_steps' is '5'"),
        ({"every_n_train_steps": True, "reason": "r"}, "field 'snapshot_interval.every_n_train_steps' is True"),
        ({"every_n_train_steps": 5}, "field 'snapshot_interval' needs a reason"),
    ],
)
def test_a_malformed_snapshot_interval_record_is_refused_naming_the_manifest_and_the_field(
    run: Path, tmp_path: Path, record: object, named: str
) -> None:
    checkpoint = tmp_path / "epoch=0-step=3"
    shutil.copytree(run / "ckpts" / "epoch=0-step=3", checkpoint)
    manifest = json.loads((checkpoint / MANIFEST_NAME).read_text())
    manifest["snapshot_interval"] = record
    (checkpoint / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(ManifestError, match=re.escape(str(checkpoint))) as refused:
        read_manifest(checkpoint)
    assert named in str(refused.value)
