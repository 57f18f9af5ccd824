"""The private members of Lightning's ``ModelCheckpoint`` that ``ManifestCheckpoint`` overrides, calls,
reads or replaces, listed in one place with the parameters the tested Lightning gives them.

``ManifestCheckpoint`` is a ``ModelCheckpoint``, so every argument a user already passes keeps its
meaning; but Lightning has no public hook for where a save goes, what retention removes or what
``"last"`` resolves to. A release that renamed one of these members, or changed its parameters, would
change what the callback does without an error. ``tests/test_compat.py`` checks every entry against
the installed Lightning (one named test each) and that the callback's classes reach no private
``ModelCheckpoint`` member through ``self`` that is not listed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Use = Literal["overridden", "called", "read", "replaced"]


@dataclass(frozen=True)
class PrivateMember:
    """One private ``ModelCheckpoint`` member and why the callback needs it."""

    name: str
    uses: tuple[Use, ...]
    parameters: tuple[str, ...] | None  # a method's parameter names; None for an attribute
    works_around: str


MODEL_CHECKPOINT_MEMBERS: tuple[PrivateMember, ...] = (
    PrivateMember(
        "_save_checkpoint",
        ("overridden", "called"),
        ("self", "trainer", "filepath"),
        "every save commits through the store (hidden folder, hashes, manifest, atomic publish) instead"
        " of trainer.save_checkpoint writing one file in place",
    ),
    PrivateMember(
        "_remove_checkpoint",
        ("overridden", "called"),
        ("self", "trainer", "filepath"),
        "retention removes through the store, waits for an async save in flight, and never removes the"
        " last recoverable checkpoint",
    ),
    PrivateMember(
        "_should_save_on_exception",
        ("called",),
        ("self", "trainer"),
        "save_on_exception's own save runs only where the last step's end could not be saved, and is"
        " then marked not recoverable",
    ),
    PrivateMember(
        "_save_last_checkpoint",
        ("overridden",),
        ("self", "trainer", "monitor_candidates"),
        "save_last's last.ckpt is a second name of the step's committed file (made when it commits, also"
        " under async_save), not a second write of the step",
    ),
    PrivateMember(
        "_enable_version_counter",
        ("read",),
        None,
        "save_last's name takes ModelCheckpoint's version counter, as its own _save_last_checkpoint does",
    ),
    PrivateMember(
        "_find_last_checkpoints",
        ("overridden",),
        ("self", "trainer"),
        'ckpt_path="last" resolves to the newest recoverable checkpoint that verifies, not the newest file named last',
    ),
    PrivateMember(
        "_should_remove_checkpoint",
        ("overridden", "called"),
        ("self", "trainer", "previous", "current"),
        "Lightning keeps the checkpoint a run resumed from forever; here retention counts it once a newer"
        " one has committed",
    ),
    PrivateMember(
        "_monitor_candidates",
        ("called", "overridden"),
        ("self", "trainer"),
        "save_now's checkpoints are named by the user's filename template like every other save; a"
        " name states global_step even where the user logs a 'step' of their own",
    ),
    PrivateMember(
        "_ModelCheckpoint__resolve_ckpt_dir",
        ("called",),
        ("self", "trainer"),
        'where the callback saves, before setup: ckpt_path="last" is resolved before setup runs',
    ),
    PrivateMember(
        "_fs",
        ("replaced",),
        None,
        "ModelCheckpoint re-creates its filesystem from the bare URL; an object-store URL needs the"
        " callback's storage options (endpoint, credentials) on every access",
    ),
    PrivateMember(
        "_every_n_train_steps",
        ("read", "replaced"),
        None,
        "CheckpointCadence retunes the step interval of saves during a run",
    ),
    PrivateMember("_every_n_epochs", ("read",), None, "part of the callback's state key"),
    PrivateMember("_train_time_interval", ("read",), None, "part of the callback's state key"),
    PrivateMember(
        "_last_global_step_saved",
        ("read", "replaced"),
        None,
        "the step of the newest save, also while an async save is still in flight",
    ),
    PrivateMember(
        "_last_checkpoint_saved",
        ("read", "replaced"),
        None,
        "the newest save's path: save_now returns it instead of saving the same step twice",
    ),
)
"""Every private ``ModelCheckpoint`` member the callback's classes use, and what each works around."""
