"""The resume policy: which checkpoint a run may continue from, decided before anything is unpickled.

A checkpoint resumes exactly only into the run that wrote it: the same code, config, data, model
and (unless resharding is allowed) world size. A difference is refused with every differing key and
both ways out, not discovered as a silently different continuation. The ``refuse_*`` functions are
pure functions of the manifest and this run's provenance; :class:`ResumeGuard` holds this run's
side (its provenance, the checkpoint it resumed from) for ``ManifestCheckpoint``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from lightning_field.checkpoint import stop_points
from lightning_field.checkpoint.resolver import Resolution
from lightning_field.compat import lightning as internals
from lightning_field.core.distributed import all_gather_objects, broadcast_object
from lightning_field.core.errors import ResumeMismatchError
from lightning_field.core.events import EventLog
from lightning_field.core.manifest import DataProvenance, Manifest, Provenance, TrainerSettings
from lightning_field.core.signing import keys_from_environment
from lightning_field.core.storage import Location, same_location
from lightning_field.state import provenance, reshard
from lightning_field.state.provenance_compare import diff_provenance
from lightning_field.state.trainer_settings import allowed_changes, change_lines, refuse_changed_settings
from lightning_field.state.trainer_settings import trainer_settings as settings_of

log = logging.getLogger(__name__)

CONFIG_KEY_PREFIX = "config.resolved."
"""How the provenance diff names a config key; users write the key without it."""

ARCHITECTURE_KEY = "model.architecture"


def short_key(key: str) -> str:
    """A resume difference's name as a command line writes it: ``model.hidden``, ``world_size``."""
    return key.removeprefix(CONFIG_KEY_PREFIX)


def is_allowed(key: str, allowed: Iterable[str]) -> bool:
    """Whether ``ResumeConfig.allow_mismatch`` covers ``key``: named as the user wrote it (``model.hidden``)
    or in full (``config.resolved.model.hidden``), or by a prefix (``model``)."""
    names = (key, key.removeprefix(CONFIG_KEY_PREFIX)) if key.startswith(CONFIG_KEY_PREFIX) else (key,)
    return any(name == a or name.startswith(a + ".") for name in names for a in allowed)


def identity_view(code: Mapping[str, Any], resolved_config: Any, world_size: int) -> dict[str, Any]:
    """What a checkpoint and a run are compared on: code, resolved config and world size."""
    return {"code": dict(code), "config": {"resolved": resolved_config}, "world_size": world_size}


def refuse_unrecoverable(manifest: Manifest, path: Location, inexact_allowed: bool) -> None:
    """Raises:
    ResumeMismatchError: the checkpoint is not recoverable and ``ResumeConfig.inexact`` did not choose it."""
    if not manifest.recoverable and not inexact_allowed:
        raise ResumeMismatchError(
            f"Checkpoint {path} is not recoverable, it lacks: {'; '.join(manifest.missing)}. Load its weights"
            " with lightning_field.load_weights() instead of resuming from it."
        )


def refuse_on_differences(
    saved: Mapping[str, Any], current: Mapping[str, Any], allowed: Iterable[str], where: Location | str
) -> None:
    """Warn for each allowed difference; raise for the rest.

    Raises:
        ResumeMismatchError: some difference is not allowed; ``differences`` holds them all.
    """
    allowed = tuple(allowed)
    diffs = diff_provenance(saved, current)
    blocking = {k: v for k, v in diffs.items() if not is_allowed(k, allowed)}
    for key in set(diffs) - set(blocking):
        rank_zero_warn(f"Resuming despite allowed difference {key}: {diffs[key][0]!r} -> {diffs[key][1]!r}")
    if blocking:
        lines = "\n".join(f"  {k}: {a!r} (checkpoint) != {b!r} (this run)" for k, (a, b) in sorted(blocking.items()))
        names = ", ".join(repr(k) for k in sorted(blocking))
        raise ResumeMismatchError(
            f"Refusing to resume from {where}: it was written by a different run.\n{lines}\n"
            "If this is intended, allow it explicitly:"
            f" ManifestCheckpoint(resume=ResumeConfig(allow_mismatch=[{names}])).",
            differences=blocking,
        )


def refuse_changed_architecture(
    manifest: Manifest, state_dict: Mapping[str, Any], allowed: Iterable[str], path: Location
) -> None:
    """A model changed in code is named by its manifest's shapes, before torch's ``load_state_dict``
    would fail with a wall of missing keys and size mismatches.

    Raises:
        ResumeMismatchError: tensors were added, removed or reshaped, and ``model.architecture`` is
            not allowed to differ.
    """
    if is_allowed(ARCHITECTURE_KEY, allowed):
        return
    changes = provenance.architecture_differences(
        manifest.provenance.get("model") or {}, provenance.architecture_shapes(state_dict)
    )
    if changes:
        raise ResumeMismatchError(
            f"Refusing to resume from {path}: the model's architecture changed since it was saved.\n"
            + "\n".join(f"  {change}" for change in changes)
            + "\nStart a new run for the new model, or allow it explicitly:"
            f" ManifestCheckpoint(resume=ResumeConfig(allow_mismatch=['{ARCHITECTURE_KEY}'])).",
            differences={ARCHITECTURE_KEY: changes},
        )


def check_resume(
    manifest: Manifest,
    path: Location,
    *,
    code: Mapping[str, Any],
    resolved_config: Any,
    world_size: int,
    state_dict: Mapping[str, Any] | None,
    allowed: Iterable[str],
    inexact_allowed: bool,
) -> dict[str, Any] | None:
    """The whole policy for one resume, before anything is unpickled.

    Returns:
        Where this run is resharded from (checkpoint, step, both world sizes) when the world size
        changed and that is allowed, else None: every later manifest of the run records it.

    Raises:
        ResumeMismatchError: the checkpoint is not recoverable, or differs from this run in code,
            config, world size or architecture, and the difference is not allowed.
    """
    allowed = tuple(allowed)
    refuse_unrecoverable(manifest, path, inexact_allowed)
    current = identity_view(code, resolved_config, world_size)
    saved = identity_view(
        manifest.provenance.get("code", {}), manifest.provenance.get("config", {}).get("resolved"), manifest.world_size
    )
    refuse_on_differences(saved, current, allowed, path)
    if state_dict is not None:
        refuse_changed_architecture(manifest, state_dict, allowed, path)
    if world_size == manifest.world_size:
        return None
    return {
        "checkpoint": str(path),
        "step": manifest.step,
        "world_size": manifest.world_size,
        "to_world_size": world_size,
    }


class ResumeGuard:
    """One run's identity, recorded at set-up, and the checkpoint it resumed from, if any.

    The callback calls :meth:`record` at ``setup``, :meth:`check` from the CheckpointIO before a
    checkpoint is unpickled, :meth:`check_data` at ``on_train_start`` (the data fingerprint needs
    the train loaders, which exist only then), and :meth:`manifest_provenance` at every save.

    Args:
        allowed: provenance differences to accept on resume (``ResumeConfig.allow_mismatch``).
        allow_changed: Trainer settings a resume may change (``state.trainer_settings.ALLOWABLE``).
        events: the run's event log, where there is one (rank 0, while fitting).

    Raises:
        ValueError: ``allow_changed`` names something else.
    """

    def __init__(
        self,
        allowed: Iterable[str] = (),
        allow_changed: Iterable[str] = (),
        events: Callable[[], EventLog | None] = lambda: None,
        resume_inexact: bool = False,
    ) -> None:
        self.allowed = tuple(allowed)
        self.resume_inexact = resume_inexact  # an unrecoverable checkpoint may be resumed, marked inexact
        self.allow_changed = allowed_changes(allow_changed)
        self.resumed: Manifest | None = None
        self.resharded_from: dict[str, Any] | None = None
        self.inexact: dict[str, Any] | None = None
        self.changed_settings: list[dict[str, Any]] = []  # the lineage's allowed changes (provenance.changed_settings)
        self.run_id: str | None = None  # the lineage's run (provenance.run_id): this run's, or the resumed one's
        self._static: Provenance = {}
        self._settings: TrainerSettings = {}
        self._trainer: pl.Trainer | None = None
        self._data: DataProvenance | None = None
        self._events = events

    def record(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, config: Mapping[str, Any] | None, code_dir: Any
    ) -> None:
        """This run's code, resolved config (secrets redacted; by default the module's and the
        datamodule's hparams) and environment; a malformed checkpoint key fails here, before the first step."""
        keys_from_environment()
        self._trainer = trainer
        if config is None:
            config = {"model": dict(pl_module.hparams)}
            datamodule = internals.trainer_datamodule(trainer)
            if datamodule is not None and getattr(datamodule, "hparams", None):
                config["datamodule"] = dict(datamodule.hparams)
        self._static = {
            "code": provenance.code_provenance(code_dir, model=pl_module),
            "config": provenance.config_provenance(dict(config)),
            "environment": provenance.environment_provenance(trainer),
        }
        self._settings = settings_of(trainer)

    def code(self) -> Mapping[str, Any]:
        """This run's code identity (versions, git commit and diff hash) as :meth:`record` found it; {} before."""
        return self._static.get("code", {})

    def resolved(self, resolution: Resolution) -> None:
        """What ``ckpt_path="last"`` chose (the one place a resolution reaches the guard): an
        unrecoverable checkpoint chosen on purpose marks every later manifest; any other pick is exact."""
        self.inexact = resolution.inexact.record() if resolution.inexact is not None else None

    def choose_inexact(self, checkpoint: Location, missing: Sequence[str]) -> None:
        """``ResumeConfig.inexact``: this unrecoverable checkpoint may be resumed, and every later
        manifest says so."""
        self.inexact = {"checkpoint": str(checkpoint), "missing": list(missing)}

    def check(self, manifest: Manifest, path: Location) -> None:
        """The whole policy (:func:`check_resume`) for ``manifest``, as the run :meth:`record`-ed sees it;
        called by the CheckpointIO before anything is unpickled.

        Raises:
            ResumeMismatchError: see :func:`check_resume`.
        """
        trainer = self._trainer
        module = trainer.lightning_module if trainer is not None else None
        if self.resume_inexact and not manifest.recoverable and self.inexact is None:
            # An explicit ckpt_path= as "last" would have chosen it: resumed, and the lineage marked so.
            self.choose_inexact(path, manifest.missing)
            rank_zero_warn(
                f"lightning_field: resuming from {path}, which is NOT recoverable ({'; '.join(manifest.missing)}),"
                " as ResumeConfig(inexact=True) allows: this continuation is not exact. Every later manifest records"
                " provenance.inexact_resume."
            )
        self.resharded_from = check_resume(
            manifest,
            path,
            code=self._static.get("code", {}),
            resolved_config=self._static.get("config", {}).get("resolved"),
            world_size=trainer.world_size if trainer else manifest.world_size,
            state_dict=module.state_dict() if module is not None else None,
            allowed=self.allowed,
            inexact_allowed=self.inexact is not None and same_location(self.inexact["checkpoint"], path),
        )
        if trainer is not None and trainer.state.fn == TrainerFn.FITTING:
            self._check_lineage(manifest, path)
            stop_points.announce_finished(trainer, manifest, path, self._events())
        self._join_run(manifest)
        self.resumed = manifest

    def _join_run(self, manifest: Manifest) -> None:
        """A resume continues the run that wrote the checkpoint, and an evaluation of it (validate, test,
        predict) belongs to that run too: its event log and every later manifest say so."""
        run_id = manifest.provenance.get("run_id")
        if isinstance(run_id, str) and run_id:
            self.run_id = run_id
            if (events := self._events()) is not None:
                events.join(run_id)

    def _check_lineage(self, manifest: Manifest, path: Location) -> None:
        """Refuse changed Trainer settings (:func:`~lightning_field.state.trainer_settings.refuse_changed_settings`);
        an allowed change, those the lineage carries already and an inexact resume it carries go into
        every later manifest: a lineage once inexact stays so, whichever checkpoint of it resumes."""
        carried = list(manifest.provenance.get("changed_settings") or [])
        saved = manifest.provenance.get("trainer")
        if saved is None:
            log.info("%s records no Trainer settings (written before they were recorded): not compared", path)
        changes = refuse_changed_settings(saved or {}, self._settings, self.allow_changed, path)
        if changes:
            rank_zero_warn(
                f"lightning_field: resuming from {path} with changed Trainer settings, as resume.allow_changed allows"
                f" ({'; '.join(change_lines(changes))}): this lineage is no longer exact against an uninterrupted"
                " run. Every later manifest records provenance.changed_settings."
            )
            entry = {"checkpoint": str(path), "step": manifest.step, "changes": {k: [*v] for k, v in changes.items()}}
            carried.append(entry)
            if (events := self._events()) is not None:
                events.emit("settings_changed", step=manifest.step, payload=entry)
        self.changed_settings = carried
        if self.inexact is None and manifest.provenance.get("inexact_resume"):
            self.inexact = dict(manifest.provenance["inexact_resume"])

    def check_ranks_resumed_alike(self, ckpt_path: Any) -> None:
        """Every rank must have resumed from the same save: its name, step and commit time (each node
        loads its own copy of a snapshot), or for a file without a manifest, the same path. Collective.

        Raises:
            RuntimeError: the ranks resumed from different checkpoints.
        """
        identity: tuple[str, int, float] | str | None = None
        if ckpt_path:
            resumed = self.resumed
            identity = str(ckpt_path) if resumed is None else (resumed.name, resumed.step, resumed.created_unix)
        resumed_from = all_gather_objects(identity)
        if len(set(resumed_from)) > 1:
            raise RuntimeError(f"Ranks resumed from different checkpoints {resumed_from}; pass an explicit ckpt_path.")

    def check_data(self, trainer: pl.Trainer, loaders: Sequence[Any]) -> None:
        """Fingerprint the training data (rank 0, broadcast) and refuse a resume onto other data.

        Collective: every rank calls it at ``on_train_start``.

        Raises:
            ResumeMismatchError: the resumed checkpoint was written on different data.
        """
        self._fingerprint_data(trainer, loaders)
        self._settings["train_loaders"] = len(loaders)
        saved = self.resumed.provenance.get("data") if self.resumed is not None else None
        if self.resumed is not None and saved is not None:
            before: dict[str, Any] = dict(saved)
            now: dict[str, Any] | None = dict(self._data) if self._data is not None else None
            built = (before.pop("loaders_epoch", None), now.pop("loaders_epoch", None) if now is not None else None)
            if None in built or built[0] == built[1]:
                refuse_on_differences({"data": before}, {"data": now}, self.allowed, self.resumed.name)
            elif trainer.is_global_zero:
                log.info(
                    "Train data not compared with %s: its loaders were built for epoch %s, this run's for epoch"
                    " %s (reload_dataloaders_every_n_epochs)",
                    self.resumed.name,
                    *built,
                )
        if self.resharded_from is not None and trainer.is_global_zero:
            old, new = self.resharded_from["world_size"], self.resharded_from["to_world_size"]
            # Logged like the RNG and position notes of the remap itself (a warnings filter must not hide it).
            for warning in reshard.order_warnings(list(loaders), old, new):
                log.warning("Resharded resume from %s: %s", self.resharded_from["checkpoint"], warning)

    def loaders_reloaded(self, trainer: pl.Trainer) -> None:
        """At an epoch's start: where ``reload_dataloaders_every_n_epochs`` built new train loaders, the
        data every later manifest records is theirs. Collective: every rank calls it at the same epochs."""
        built = internals.train_loaders_built_for(trainer)
        if built is not None and (self._data or {}).get("loaders_epoch") != built:
            self._fingerprint_data(trainer, list(internals.iter_loaders(trainer.train_dataloader)))

    def _fingerprint_data(self, trainer: pl.Trainer, loaders: Sequence[Any]) -> None:
        fingerprint = None  # rank 0's, broadcast: every rank records the same
        if trainer.is_global_zero:
            datamodule = internals.trainer_datamodule(trainer)
            fingerprint = provenance.data_provenance(datamodule, loaders[0] if loaders else None)
            built = internals.train_loaders_built_for(trainer)
            if fingerprint is not None and built is not None:
                fingerprint["loaders_epoch"] = built
        self._data = broadcast_object(fingerprint)

    def manifest_provenance(self, world_size: int) -> Provenance:
        """What a manifest records about this run (all but the model's, hashed at commit time)."""
        recorded: Provenance = {**self._static, "data": self._data, "world_size": world_size}
        recorded["trainer"] = {**self._settings, "world_size": world_size}
        if self.resharded_from:
            recorded["resharded_from"] = self.resharded_from
        if self.inexact:
            recorded["inexact_resume"] = self.inexact
        if self.changed_settings:
            recorded["changed_settings"] = self.changed_settings
        if self.run_id is not None:
            recorded["run_id"] = self.run_id
        return recorded
