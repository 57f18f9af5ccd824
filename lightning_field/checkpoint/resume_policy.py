"""The resume policy: which checkpoint a run may continue from, decided before anything is unpickled.

A checkpoint resumes exactly only into the run that wrote it: the same code, config, data, model
and (unless resharding is allowed) world size. A difference is refused with every differing key and
both ways out, not discovered as a silently different continuation. The ``refuse_*`` functions are
pure functions of the manifest and this run's provenance; :class:`ResumeGuard` holds this run's
side (its provenance, the checkpoint it resumed from) for ``ManifestCheckpoint``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from lightning_field.checkpoint.resolver import committed_checkpoints, latest_recoverable
from lightning_field.checkpoint.stores import CheckpointReader, read_manifest
from lightning_field.checkpoint.verify import VerifyReport
from lightning_field.compat import lightning as internals
from lightning_field.core.distributed import all_gather_objects, broadcast_object
from lightning_field.core.errors import ResumeMismatchError
from lightning_field.core.launcher_env import env_global_rank
from lightning_field.core.manifest import DataProvenance, Manifest, Provenance
from lightning_field.core.signing import keys_from_environment
from lightning_field.core.storage import Location, basename, same_location
from lightning_field.state import provenance, reshard
from lightning_field.state.provenance_compare import diff_provenance

log = logging.getLogger(__name__)

CONFIG_KEY_PREFIX = "config.resolved."
"""How the provenance diff names a config key; users write the key without it."""

ARCHITECTURE_KEY = "model.architecture"


def short_key(key: str) -> str:
    """A resume difference's name as a command line writes it: ``model.hidden``, ``world_size``."""
    return key.removeprefix(CONFIG_KEY_PREFIX)


def is_allowed(key: str, allowed: Iterable[str]) -> bool:
    """Whether ``allow_resume_mismatch`` covers ``key``: named as the user wrote it (``model.hidden``)
    or in full (``config.resolved.model.hidden``), or by a prefix (``model``)."""
    names = (key, key.removeprefix(CONFIG_KEY_PREFIX)) if key.startswith(CONFIG_KEY_PREFIX) else (key,)
    return any(name == a or name.startswith(a + ".") for name in names for a in allowed)


def identity_view(code: Mapping[str, Any], resolved_config: Any, world_size: int) -> dict[str, Any]:
    """What a checkpoint and a run are compared on: code, resolved config and world size."""
    return {"code": dict(code), "config": {"resolved": resolved_config}, "world_size": world_size}


def refuse_unrecoverable(manifest: Manifest, path: Location, inexact_allowed: bool) -> None:
    """Raises:
    ResumeMismatchError: the checkpoint is not recoverable and ``resume_inexact`` did not choose it."""
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
            f"If this is intended, allow it explicitly: ManifestCheckpoint(allow_resume_mismatch=[{names}]).",
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
            f" ManifestCheckpoint(allow_resume_mismatch=['{ARCHITECTURE_KEY}']).",
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


class NoRecoverableCheckpointError(RuntimeError):
    """``ckpt_path="last"`` found committed checkpoints, but none that resumes exactly.

    Training from step 0 instead would silently throw the run's work away, so it is refused; the
    message lists every checkpoint with what it lacks, and the ways out.
    """


def no_recoverable_message(
    where: Location, entries: Sequence[Any], skipped: Mapping[Location, str] | None = None
) -> str:
    """Why ``ckpt_path="last"`` refuses: each checkpoint (up to 10) with what it lacks or why it was
    passed over (``skipped``: a damaged file, a failed drill), and the ways out that fit."""
    skipped = skipped or {}
    lines = []
    for entry in entries[:10]:
        manifest = entry.manifest
        if entry.path in skipped:
            why = skipped[entry.path]
        elif manifest is None:
            why = f"unreadable manifest ({entry.error})"
        elif manifest.kind != "recovery":
            why = "a weights-only export"
        else:
            why = "; ".join(manifest.missing) or "failed verification"
        lines.append(f"  {basename(entry.path)}: {why}")
    more = f"\n  ... and {len(entries) - 10} more" if len(entries) > 10 else ""
    ways = []
    if any(e.path in skipped for e in entries):
        ways.append(
            "a damaged checkpoint cannot be resumed, exactly or not: put the named file back from a copy if you"
            " have one; a fallback needs an older recoverable checkpoint, so keep two or more"
            " (ManifestCheckpoint(save_top_k=2) or -1, as docs/checkpoints.md says)"
        )
    if any(e.manifest is not None and e.manifest.kind == "recovery" and e.path not in skipped for e in entries):
        ways.append(
            "fix what they lack and start a new run (these checkpoints stay as they are); or resume their weights"
            " and optimizer anyway, knowing the continuation is not exact, with ManifestCheckpoint(resume_inexact=True)"
        )
    ways.append("pass ckpt_path=None to start over on purpose")
    return (
        f'ckpt_path="last": {len(entries)} checkpoint(s) under {where}, none recoverable, so this run would'
        " silently start over from step 0. Refusing.\n" + "\n".join(lines) + more + "\n"
        "Ways out: " + "; or ".join(ways) + "."
    )


class ResumeGuard:
    """One run's identity, recorded at set-up, and the checkpoint it resumed from, if any.

    The callback calls :meth:`record` at ``setup``, :meth:`check` from the CheckpointIO before a
    checkpoint is unpickled, :meth:`check_data` at ``on_train_start`` (the data fingerprint needs
    the train loaders, which exist only then), and :meth:`manifest_provenance` at every save.

    Args:
        allowed: provenance differences to accept on resume (``allow_resume_mismatch``).
    """

    def __init__(self, allowed: Iterable[str] = ()) -> None:
        self.allowed = tuple(allowed)
        self.resumed: Manifest | None = None
        self.resharded_from: dict[str, Any] | None = None
        self.inexact: dict[str, Any] | None = None
        self._static: Provenance = {}
        self._trainer: pl.Trainer | None = None
        self._data: DataProvenance | None = None

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

    def choose_inexact(self, checkpoint: Location, missing: Sequence[str]) -> None:
        """``resume_inexact``: this unrecoverable checkpoint may be resumed, and every later
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
        self.resumed = manifest

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
        fingerprint = None
        if trainer.is_global_zero:
            datamodule = internals.trainer_datamodule(trainer)
            fingerprint = provenance.data_provenance(datamodule, loaders[0] if loaders else None)
        self._data = broadcast_object(fingerprint)
        saved = self.resumed.provenance.get("data") if self.resumed is not None else None
        if self.resumed is not None and saved is not None:
            refuse_on_differences({"data": saved}, {"data": self._data}, self.allowed, self.resumed.name)
        if self.resharded_from is not None and trainer.is_global_zero:
            old, new = self.resharded_from["world_size"], self.resharded_from["to_world_size"]
            # Logged like the RNG and position notes of the remap itself (a warnings filter must not hide it).
            for warning in reshard.order_warnings(list(loaders), old, new):
                log.warning("Resharded resume from %s: %s", self.resharded_from["checkpoint"], warning)

    def manifest_provenance(self, world_size: int) -> Provenance:
        """What a manifest records about this run (all but the model's, hashed at commit time)."""
        recorded: Provenance = {**self._static, "data": self._data, "world_size": world_size}
        if self.resharded_from:
            recorded["resharded_from"] = self.resharded_from
        if self.inexact:
            recorded["inexact_resume"] = self.inexact
        return recorded


def resolve_last(
    where: Location,
    inexact_guard: ResumeGuard | None = None,
    store: CheckpointReader | None = None,
    reports: MutableMapping[Location, VerifyReport] | None = None,
    snapshot: tuple[Location, int] | None = None,
) -> str | None:
    """``ckpt_path="last"``: the newest recoverable checkpoint under a local ``where``, or None when
    there is no committed checkpoint at all (training starts at step 0, and says so).
    ``reports`` receives the verifications made, for the load to hand on. ``snapshot``: the newest
    step snapshot that verifies, and its step, taken instead where it is newer (one resume rule
    over the tiers: the newest verified step wins, a persistent checkpoint on a tie).

    With ``inexact_guard`` (``resume_inexact=True``), the newest unrecoverable recovery checkpoint
    is chosen when no recoverable one exists, and the guard records it for every later manifest.

    Raises:
        ValueError: ``where`` is a URL, which ``ckpt_path="last"`` cannot resolve through Lightning.
        NoRecoverableCheckpointError: checkpoints exist, but none may be resumed.
    """
    if not isinstance(where, Path):  # a URL (a local location is a Path)
        # Lightning would re-open the found URL without the storage options and read a prefix's
        # modification time, which object stores do not have: resolve it explicitly instead.
        raise ValueError(
            f'ckpt_path="last" cannot be resolved by Lightning for the object-store dirpath {where}. Pass'
            f" ckpt_path=lightning_field.latest_recoverable({str(where)!r}, storage_options) instead."
        )
    if snapshot is not None:
        snapshot_path, snapshot_step = snapshot
        try:
            persistent = resolve_last(where, inexact_guard, store, reports)
        except NoRecoverableCheckpointError:
            persistent = None  # none of them may be resumed; the snapshot, which verified, may
        if persistent is not None and read_manifest(persistent, store=store).step >= snapshot_step:
            return persistent
        if inexact_guard is not None:
            inexact_guard.inexact = None  # the snapshot is recoverable: this continuation is exact
        rank_zero_info(f"lightning_field: resuming from the snapshot {snapshot_path} (step {snapshot_step}),"
                       f" newer than every recoverable checkpoint under {where}.")  # fmt: skip
        return str(snapshot_path)
    skipped: dict[Location, str] = {}
    found = latest_recoverable(where, reports=reports, skipped=skipped, log_skips=env_global_rank() == 0, store=store)
    if found is not None and not Path(found).exists():
        # Lightning drops a "last" it cannot see on the filesystem and starts over: never silently.
        raise ValueError(
            f'ckpt_path="last" found {found} in the store given to ManifestCheckpoint, where Lightning cannot'
            f" see it, and would start over. Pass ckpt_path=lightning_field.latest_recoverable({str(where)!r},"
            " store=store) instead."
        )
    if found is not None:
        return str(found)
    entries = committed_checkpoints(where, store=store)
    if not entries:
        rank_zero_info(f"lightning_field: no committed checkpoint under {where} yet: training starts at step 0.")
        return None
    # A damaged checkpoint cannot be resumed inexactly either: its bytes are not what was saved.
    resumable = [
        e for e in entries if e.manifest is not None and e.manifest.kind == "recovery" and e.path not in skipped
    ]
    if inexact_guard is not None and resumable:
        chosen = resumable[0]
        assert chosen.manifest is not None
        inexact_guard.choose_inexact(chosen.path, chosen.manifest.missing)
        rank_zero_warn(
            f"lightning_field: resuming from {chosen.path}, which is NOT recoverable"
            f" ({'; '.join(chosen.manifest.missing)}): weights, optimizer and loop state are restored, but"
            " this continuation is not exact. Every later manifest records provenance.inexact_resume."
        )
        return str(chosen.path)
    raise NoRecoverableCheckpointError(no_recoverable_message(where, entries, skipped))
