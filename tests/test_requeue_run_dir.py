"""A user's own Hydra app, with ``ManifestCheckpoint`` beside plain Lightning.

The app is written as lightning-hydra-template writes them: each attempt in a timestamped run
directory. Its paths open as Lightning's do (``load_from_checkpoint`` and ``torch.load`` of
``best_model_path``, the same weights as plain Lightning's), and ``field ckpt export`` writes them
out for inference. Requeued, it finds no checkpoint in its new directory: plain Lightning trains from
step 0 after one info line; with ``ManifestCheckpoint`` the restart (``SLURM_RESTART_COUNT``) is named
with the likely cause and how to keep the directory across requeues.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

import pytest
from conftest import python_program

from lightning_field.core.launcher_env import restart_of

APP = textwrap.dedent(
    """
    import os

    import hydra
    import lightning.pytorch as pl
    import torch
    from safetensors.torch import load_file
    from hydra.core.hydra_config import HydraConfig
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.demos.boring_classes import BoringModel
    from omegaconf import DictConfig

    from lightning_field import ManifestCheckpoint


    @hydra.main(version_base="1.3", config_path=None, config_name=None)
    def main(cfg: DictConfig) -> None:
        out = HydraConfig.get().runtime.output_dir
        kind = ManifestCheckpoint if cfg.checkpoint == "field" else ModelCheckpoint
        pl.seed_everything(0)
        trainer = pl.Trainer(max_steps=2, default_root_dir=out, logger=False, enable_progress_bar=False,
                             callbacks=[kind(dirpath=f"{out}/checkpoints")], limit_val_batches=0)
        trainer.fit(BoringModel(), ckpt_path="last")
        print("TRAINED FROM STEP 0 TO", trainer.global_step)
        best = trainer.checkpoint_callback.best_model_path
        weights = BoringModel.load_from_checkpoint(best).state_dict()
        saved = torch.load(best)  # torch's default: weights_only=True
        sums = ",".join(f"{value.double().sum().item():.17g}" for value in weights.values())
        print("LOADED", os.path.basename(best), saved["global_step"], sums)
        if cfg.checkpoint == "field":
            from lightning_field.cli.main import main as field

            assert field(["ckpt", "export", best, f"{out}/model.safetensors", "--format", "safetensors"]) == 0
            exported = load_file(f"{out}/model.safetensors")
            print("EXPORTED", ",".join(f"{exported[k].double().sum().item():.17g}" for k in weights))


    if __name__ == "__main__":
        main()
    """
)


def _attempt(app: Path, checkpoint: str, restarts: int) -> str:
    env = {**os.environ, "SLURM_RESTART_COUNT": str(restarts), "PYTHONUNBUFFERED": "1"}
    env.pop("SLURM_JOB_ID", None)
    # Hydra's default run directory, to the microsecond so two quick attempts never share one.
    overrides = [f"+checkpoint={checkpoint}", "hydra.run.dir=outputs/${now:%Y-%m-%d}/${now:%H-%M-%S-%f}"]
    done = subprocess.run([python_program(), str(app), *overrides], cwd=app.parent, env=env, capture_output=True,
                          text=True, timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


@pytest.mark.slow
def test_best_model_path_opens_and_exports_and_a_requeue_into_a_new_timestamped_run_directory_is_named(
    tmp_path: Path,
) -> None:
    app = tmp_path / "train.py"
    app.write_text(APP)
    loaded = {}
    for checkpoint in ("plain", "field"):
        first = _attempt(app, checkpoint, restarts=0)
        assert "TRAINED FROM STEP 0 TO 2" in first and "is a restart" not in first
        loaded[checkpoint] = next(line.split() for line in first.splitlines() if line.startswith("LOADED "))
        if checkpoint == "field":  # the same name, step and weights as plain Lightning's, and exported whole
            assert loaded["field"] == loaded["plain"] and loaded["plain"][1:3] == ["epoch=0-step=2.ckpt", "2"]
            assert f"EXPORTED {loaded['plain'][3]}" in first
        requeued = _attempt(app, checkpoint, restarts=1)
        assert "TRAINED FROM STEP 0 TO 2" in requeued  # both start over: the first attempt's directory is elsewhere
        if checkpoint == "plain":
            assert "restart" not in requeued.lower()  # Lightning alone gives no sign that work was lost
        else:
            assert "this process is a restart (SLURM_RESTART_COUNT=1), but there is no committed checkpoint" in requeued
            assert "timestamped run directory" in requeued and "hydra.run.dir=" in requeued


def test_a_restart_is_read_from_either_launchers_count() -> None:
    assert restart_of({}) is None
    assert restart_of({"SLURM_RESTART_COUNT": "0", "TORCHELASTIC_RESTART_COUNT": "0"}) is None
    assert restart_of({"SLURM_RESTART_COUNT": "2"}) == "SLURM_RESTART_COUNT=2"
    assert restart_of({"TORCHELASTIC_RESTART_COUNT": "1"}) == "TORCHELASTIC_RESTART_COUNT=1"
    assert restart_of({"SLURM_RESTART_COUNT": "soon"}) is None  # not a count: no claim is made
