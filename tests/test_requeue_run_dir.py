"""A requeued job whose run directory is new for every attempt never starts over in silence.

A user's own Hydra app, written as lightning-hydra-template writes them, keeps each attempt in a
timestamped run directory. Requeued, it finds no checkpoint there: plain Lightning trains from step 0
after one info line; with ``ManifestCheckpoint`` the restart (``SLURM_RESTART_COUNT``) is named with
the likely cause and how to keep the directory across requeues.
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
    import hydra
    import lightning.pytorch as pl
    from hydra.core.hydra_config import HydraConfig
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.demos.boring_classes import BoringModel
    from omegaconf import DictConfig

    from lightning_field import ManifestCheckpoint


    @hydra.main(version_base="1.3", config_path=None, config_name=None)
    def main(cfg: DictConfig) -> None:
        out = HydraConfig.get().runtime.output_dir
        kind = ManifestCheckpoint if cfg.checkpoint == "field" else ModelCheckpoint
        trainer = pl.Trainer(max_steps=2, default_root_dir=out, logger=False, enable_progress_bar=False,
                             callbacks=[kind(dirpath=f"{out}/checkpoints")], limit_val_batches=0)
        trainer.fit(BoringModel(), ckpt_path="last")
        print("TRAINED FROM STEP 0 TO", trainer.global_step)


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
def test_a_requeue_into_a_new_timestamped_run_directory_names_the_restart_where_plain_lightning_is_silent(
    tmp_path: Path,
) -> None:
    app = tmp_path / "train.py"
    app.write_text(APP)
    for checkpoint in ("plain", "field"):
        first = _attempt(app, checkpoint, restarts=0)
        assert "TRAINED FROM STEP 0 TO 2" in first and "is a restart" not in first
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
