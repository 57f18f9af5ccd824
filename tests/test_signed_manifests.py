"""Signed manifests: with a checkpoint key, only manifests its holder signed are resumed or verified."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
from conftest import assert_bitwise_equal, make_trainer, rewrite_shared_state
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_field import CheckpointCorruptError, latest_recoverable, read_manifest, verify_checkpoint
from lightning_field.cli.main import main as field_main
from lightning_field.core.signing import KEY_ENV, KEY_FILE_ENV, SigningKeyError, keys_from_environment

SECRET = "correct-horse-battery-staple-2026"
FORGER = "a-secret-the-forger-made-up-000"


def _fit(root: Path, steps: int, ckpt_path: str | None = None) -> BoringModel:
    pl.seed_everything(0)
    model = BoringModel()
    make_trainer(root, steps).fit(model, ckpt_path=ckpt_path)
    return model


def _forge(checkpoint: Path, signer: str | None) -> None:
    """A writer of the bucket doubles the weights, rehashes the manifest and signs it with ``signer``
    (``id:secret``), or leaves it unsigned (None)."""

    def double(state: dict) -> None:
        state["state_dict"] = {k: v * 2 for k, v in state["state_dict"].items()}

    rewrite_shared_state(checkpoint, double, keys_from_environment({KEY_ENV: signer}) if signer else None)


@pytest.mark.parametrize(
    ("signer", "refusal"),
    [
        (f"k1:{FORGER}", "signature (key 'k1') does not match its content"),
        (f"k2:{FORGER}", "signed with key 'k2', which is not accepted"),
        (None, "the manifest is unsigned, and a checkpoint key is configured"),
    ],
    ids=["same-key-id-wrong-secret", "another-key", "unsigned"],
)
def test_a_signed_run_resumes_exactly_and_a_reforged_manifest_is_refused_saying_why(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    signer: str | None,
    refusal: str,
) -> None:
    monkeypatch.setenv(KEY_ENV, f"k1:{SECRET}")
    uninterrupted = _fit(tmp_path / "whole", 4)
    _fit(tmp_path / "cut", 2)
    ckpts = tmp_path / "cut" / "ckpts"
    resumed = _fit(tmp_path / "cut", 4, ckpt_path=str(ckpts / "epoch=0-step=2"))
    assert_bitwise_equal(resumed.state_dict(), uninterrupted.state_dict())
    assert read_manifest(ckpts / "epoch=0-step=4").signature["key_id"] == "k1"
    assert field_main(["ckpt", "verify", str(ckpts / "epoch=0-step=4")]) == 0
    assert "signature valid (key 'k1')" in capsys.readouterr().out

    _forge(ckpts / "epoch=0-step=4", signer)
    assert refusal in " ".join(verify_checkpoint(ckpts / "epoch=0-step=4").problems)
    assert field_main(["ckpt", "verify", str(ckpts / "epoch=0-step=4")]) == 1
    out = capsys.readouterr().out
    assert refusal in out and out.startswith(f"REFUSED  {ckpts / 'epoch=0-step=4'} (step 4)")  # intact files
    assert latest_recoverable(ckpts) == ckpts / "epoch=0-step=2"
    with pytest.raises(CheckpointCorruptError, match=refusal.split(",")[0].replace("(", r"\(").replace(")", r"\)")):
        _fit(tmp_path / "cut", 6, ckpt_path=str(ckpts / "epoch=0-step=4"))

    # Without the key nothing is checked, and inspect says what it saw.
    monkeypatch.delenv(KEY_ENV)
    assert verify_checkpoint(ckpts / "epoch=0-step=4").intact
    assert field_main(["ckpt", "inspect", str(ckpts / "epoch=0-step=4")]) == 0
    shown = capsys.readouterr().out
    assert ("signature    unsigned" in shown) if signer is None else ("not checked: no key configured" in shown)


def test_keys_rotate_the_first_signs_and_every_listed_one_is_accepted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(KEY_ENV, f"old:{SECRET}")
    _fit(tmp_path, 2)
    keyfile = tmp_path / "keys"
    keyfile.write_text(f"# rotated 2026-12\nnew:{FORGER}\nold:{SECRET}\n")
    monkeypatch.delenv(KEY_ENV)
    monkeypatch.setenv(KEY_FILE_ENV, str(keyfile))
    assert verify_checkpoint(tmp_path / "ckpts" / "epoch=0-step=2").intact
    _fit(tmp_path, 4, ckpt_path=str(tmp_path / "ckpts" / "epoch=0-step=2"))
    assert read_manifest(tmp_path / "ckpts" / "epoch=0-step=4").signature["key_id"] == "new"

    keyfile.write_text(f"new:{FORGER}\n")  # the old key retired
    problems = verify_checkpoint(tmp_path / "ckpts" / "epoch=0-step=2").problems
    assert any("signed with key 'old', which is not accepted (accepted: new)" in p for p in problems)
    assert verify_checkpoint(tmp_path / "ckpts" / "epoch=0-step=4").intact


@pytest.mark.parametrize("value", ["no-colon-here-at-all", f"k1:{SECRET[:8]}", f"k1:{SECRET},k1:{FORGER}"])
def test_a_malformed_key_stops_the_run_before_its_first_step_naming_the_variable_never_the_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    _fit(tmp_path / "earlier", 2)
    monkeypatch.setenv(KEY_ENV, value)
    model = BoringModel()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(SigningKeyError, match=KEY_ENV) as refused:
        make_trainer(tmp_path, 2).fit(model)
    assert SECRET[:8] not in str(refused.value) and FORGER not in str(refused.value)
    assert_bitwise_equal(model.state_dict(), before)  # not one step taken
    assert field_main(["ckpt", "verify", str(tmp_path / "earlier" / "ckpts" / "epoch=0-step=2")]) == 2
    assert KEY_ENV in capsys.readouterr().err
