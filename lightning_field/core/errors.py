"""The checkpoint errors' common base, and the refusal every capability raises when a checkpoint
may not resume into this run.

:class:`CheckpointError` is what a user catches to handle any checkpoint failure in one place (a
save that did not commit, a corrupt or unsafe file, a refusal to resume, a manifest that cannot be
read). Each subclass keeps the built-in base it had (``RuntimeError``, ``ValueError``, ...), so code
that caught those still does.

:class:`ResumeMismatchError` lives in ``core`` because both sides meet it: the resume policy
(``checkpoint``) refuses a different code, config, data, model or world size, and the rank-state
tracker (``state``) a train loader whose settings changed since the save.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["CheckpointError", "ResumeMismatchError"]


class CheckpointError(Exception):
    """Base of every error about a checkpoint: saving, verifying, loading or resuming one."""


class ResumeMismatchError(CheckpointError, RuntimeError):
    """The checkpoint was written by a run whose code, data, config, model or world size differ.

    Attributes:
        differences: dotted name -> (checkpoint's value, this run's), or the list of architecture
            changes under ``model.architecture``: what a command-line front end reports briefly.
        allowed_by: the ``ManifestCheckpoint`` option that would accept these differences, as a
            dotted group field (``resume.allow_changed`` for Trainer settings), None where none can.
    """

    def __init__(
        self,
        message: str,
        differences: Mapping[str, Any] | None = None,
        allowed_by: str | None = "resume.allow_mismatch",
    ) -> None:
        super().__init__(message)
        self.differences = dict(differences or {})
        self.allowed_by = allowed_by
