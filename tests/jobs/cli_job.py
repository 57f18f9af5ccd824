"""A user's LightningCLI script, as people write one, for the conformance row ``lightning-cli``.

The model, data and every callback come from the command line (``--trainer.callbacks+=...``); the
checkpoint callback is ``lightning_field.ManifestCheckpoint`` or Lightning's ``ModelCheckpoint``,
named there like any other. The one addition a user would not make: the final state goes to
``$CONFORMANCE_OUT`` for the comparison (written by ``conformance_job.write_result``).
"""

from __future__ import annotations

import os

from conformance_job import RecordRun, UserClassifier, UserData, write_result
from lightning.pytorch.cli import LightningCLI


def main() -> None:
    # overwrite: the rerun of the same command writes its config over the first attempt's.
    cli = LightningCLI(UserClassifier, UserData, save_config_kwargs={"overwrite": True})
    trainer = cli.trainer
    record = next(cb for cb in trainer.callbacks if isinstance(cb, RecordRun))
    write_result(trainer, cli.model, record, [], trainer.default_root_dir, os.environ["CONFORMANCE_OUT"])


if __name__ == "__main__":
    main()
