"""Lightning's ``WandbLogger`` internals that ``FieldWandbLogger`` builds on (Lightning 2.6).

``FieldWandbLogger`` makes one W&B run out of every restart of a training run: it must choose the
run id, directory and resume mode before ``WandbLogger`` creates the run, which WandbLogger only
takes from the keyword arguments it stored at construction (``_wandb_init``), and it must know
whether the run exists yet (``_experiment``, or ``_attach_id`` after a pickle round trip to a
spawned process). None of these has a public accessor.
"""

from __future__ import annotations

from typing import Any


def init_arguments(logger: Any) -> dict[str, Any]:
    """The ``wandb.init`` keyword arguments the logger will use, as a dict it reads at creation:
    changes to it apply to the run not yet created (``WandbLogger._wandb_init``)."""
    return logger._wandb_init


def current_run(logger: Any) -> Any:
    """The logger's W&B run if it has created or attached one, else None (no creation)."""
    return logger._experiment


def run_pending(logger: Any) -> bool:
    """Whether the logger will create a new W&B run on first use: no run yet and none to re-attach
    (``_attach_id`` is set when a logger was pickled into a spawned process with its run open)."""
    return logger._experiment is None and getattr(logger, "_attach_id", None) is None


def set_run_id(logger: Any, run_id: str) -> None:
    """The id WandbLogger reports as ``version`` before its run exists (``WandbLogger._id``)."""
    logger._id = run_id
