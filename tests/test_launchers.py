"""The launch that torch elastic can hang on restart is named at setup, with the fix."""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import pytest
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_field import ManifestCheckpoint
from lightning_field.core.distributed import elastic_restart_hazard


@pytest.mark.parametrize(
    ("env", "hazard"),
    [
        ({"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "3"}, True),
        ({"TORCHELASTIC_USE_AGENT_STORE": "False", "TORCHELASTIC_MAX_RESTARTS": "3"}, False),  # store not shared
        ({"TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_MAX_RESTARTS": "0"}, False),  # never restarts
        ({}, False),  # not under torchrun
    ],
)
def test_only_a_restarting_launch_that_shares_the_rendezvous_store_is_a_hazard(env: dict, hazard: bool) -> None:
    found = elastic_restart_hazard(env)
    assert (found is not None) is hazard
    if hazard:
        assert "TORCHELASTIC_USE_AGENT_STORE=True" in found and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in found


def test_a_fit_under_the_hazardous_launch_warns_at_setup_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    trainer = pl.Trainer(default_root_dir=tmp_path, max_steps=1, accelerator="cpu", logger=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0,
                         callbacks=[ManifestCheckpoint(dirpath=tmp_path / "ckpts")])
    with pytest.warns(UserWarning, match="TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"):
        trainer.fit(BoringModel())
