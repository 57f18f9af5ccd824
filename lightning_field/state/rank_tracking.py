"""What one rank tracks between checkpoints so that a resume continues exactly.

``ManifestCheckpoint`` decides when to save; this decides what a rank must remember for that save
to be an exact continuation point, and what it must put back on resume:

* **Validation after the saved step.** Validation inside ``fit`` draws from the same global
  generators as training (each validation loader's base seed, a user's own randomness), and they
  are left as it leaves them, as plain Lightning leaves them: nothing here writes to a random stream
  while a run goes well. A checkpoint saved at a train batch's end holds the streams from before
  the validation that followed it, so a resume runs that validation again (where Lightning would
  count it as done) and continues from the state the uninterrupted run had after it.
* **RNG before the first fetch.** A resume restores each rank's streams just before every fetch
  attempt of the train loader, until a batch arrives: the loader's own draws (shuffling, worker
  seeds) must see the saved state, not the state ``fit``'s set-up left behind.
* **The batch fetched ahead.** From a train loader without a length Lightning fetches one batch
  ahead; a save while it waits records the loaders' states and RNG streams from before its fetch
  (``PrefetchedPosition``), and the resume fetches it again from them.
* **Data position.** Plain train loaders are re-created as torchdata ``StatefulDataLoader`` (same
  dataset, sampler, collate_fn, workers, generator); their saved states, the sampler's drawn epoch
  order and the samples and tokens seen are restored, and the resumed iterator is rebuilt where
  Lightning 2.6 would not (a loader built before the restore, an epoch saved at its end).
* **Epoch-level metrics.** torchmetrics state and values logged with ``on_epoch=True`` are carried
  across a mid-epoch resume, so the epoch's logged value is the uninterrupted run's.

One tracker per checkpoint callback and rank; nothing here is collective.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.data import extract_batch_size
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from lightning_field.compat import lightning as internals
from lightning_field.core.errors import ResumeMismatchError
from lightning_field.state.data_position import restore_sampler_generators
from lightning_field.state.epoch_metrics import LoggedValueMerge, restore_torchmetrics
from lightning_field.state.loaders import Adoption, changed_loader_settings
from lightning_field.state.prefetch import PositionBeforeFetch, PrefetchedPosition
from lightning_field.state.rank_state import capture_rank_state
from lightning_field.state.rng import capture_rng_state, restore_rng_state
from lightning_field.state.streams import positions_for_the_resumed_epoch

__all__ = ["RankStateTracker"]


class RankStateTracker:
    """One rank's RNG, data-position and epoch-metric bookkeeping for exact resume.

    Args:
        generators: named ``torch.Generator`` objects the run draws from, captured and restored
            with the global streams.

    The owner calls, in training order: :meth:`install` at ``setup("fit")``; :meth:`load` from
    ``on_load_checkpoint``; :meth:`restore_on_train_start` from ``on_train_start``;
    :meth:`batch_started`, :meth:`batch_ended` and :meth:`epoch_ended` from the hooks of the
    same names; :meth:`capture` at each save; :meth:`uninstall` at ``teardown`` or on an exception.
    """

    def __init__(self, generators: Mapping[str, torch.Generator] | None = None) -> None:
        self.generators = dict(generators or {})
        self._validation_rerun_in: pl.Trainer | None = None  # the fit whose skipped validation is run again
        self.prefetched = PrefetchedPosition(self.generators)
        self.samples_seen = 0
        self.tokens_seen: int | None = None
        self.adoptions: list[Adoption] = []
        self._pending_rng: dict[str, Any] | None = None
        self._pending_prefetch_rng: dict[str, Any] | None = None
        self._fetching_for: pl.Trainer | None = None
        self.rng_at_batch_end: dict[str, Any] = {}
        self._loaded_loader_states: list[Any] | None = None
        self._loaded_sampler_state: list[dict[str, Any]] = []
        self._loaded_epoch_metrics: dict[str, Any] | None = None
        self._logged_value_merge: LoggedValueMerge | None = None
        self._resumed_epoch_closed = False
        self._stream_positions_active = torch.tensor(0)
        self._prefetch_hook_installed = False
        self._undo_loader_patch: Callable[[], None] | None = None
        self._told_adopted = False
        self._told_unresumable = False
        self._saved_loader_settings: list[Any] | None = None
        self._resuming_from: str | None = None

    # ------------------------------------------------------------------ set-up and tear-down
    def install(self, trainer: pl.Trainer) -> None:
        """Hook the train loop's fetch (RNG restore) and the train loaders (stateful adoption)."""
        self._fetching_for = trainer
        self._prefetch_hook_installed = internals.install_before_fetch(trainer, self._before_train_fetch)
        self._undo_loader_patch = internals.patch_train_loaders(trainer, self._note_adoptions)

    def _before_train_fetch(self) -> None:
        self.before_fetch()
        if self._fetching_for is not None:
            self.prefetched.before_fetch(self._fetching_for)

    def uninstall(self) -> None:
        self._fetching_for = None
        if self._validation_rerun_in is not None:
            internals.forget_validation_rerun(self._validation_rerun_in)
            self._validation_rerun_in = None
        if self._undo_loader_patch is not None:
            self._undo_loader_patch()
            self._undo_loader_patch = None

    def _note_adoptions(self, adoptions: list[Adoption]) -> None:
        """What the train loaders became when Lightning asked for them (every time it asks)."""
        self.adoptions = adoptions
        self._refuse_changed_loaders()
        adopted = [a for a in adoptions if a.adopted]
        if adopted and not self._told_adopted:
            self._told_adopted = True
            rank_zero_info(
                f"lightning_field: {len(adopted)} plain train DataLoader(s) re-created as torchdata"
                " StatefulDataLoader (same dataset, sampler, collate_fn, workers and generator), so every"
                " checkpoint holds the exact data position."
            )

    # ------------------------------------------------------------------ resume
    def load(self, rank_state: Mapping[str, Any], checkpoint: dict[str, Any], source: str | None = None) -> None:
        """Keep this rank's saved state until the train loop can use it (``on_train_start``).

        Raises:
            ResumeMismatchError: the train loaders are known already and their settings changed.
        """
        self._pending_rng = rank_state["rng"]
        self._pending_prefetch_rng = self._fetched_ahead_rng(rank_state.get("fetched_ahead"), source)
        position = rank_state.get("data_position", {})
        self._saved_loader_settings = position.get("loader_settings")
        self._resuming_from = source
        if self.adoptions:
            self._refuse_changed_loaders()
        self._loaded_loader_states = position.get("loader_states") or None
        self._loaded_sampler_state = position.get("sampler_state") or []
        self.samples_seen = int(position.get("samples_seen") or 0)
        self.tokens_seen = position.get("tokens_seen")
        self._loaded_epoch_metrics = self._checked_epoch_metrics(rank_state.get("epoch_metrics"), source)
        self._resumed_epoch_closed = bool(position.get("epoch_closed"))
        if self._resumed_epoch_closed:
            internals.resume_as_next_epoch(checkpoint)
        # In shared memory, as a stream's own epoch: loader workers, persistent ones too, see it cleared.
        self._stream_positions_active = torch.tensor(int(not self._resumed_epoch_closed)).share_memory_()
        for states in (self._loaded_loader_states, checkpoint.get("loops")):  # ours, and Lightning's own copy
            positions_for_the_resumed_epoch(states or {}, self._stream_positions_active)

    @staticmethod
    def _checked_epoch_metrics(saved: Any, source: str | None) -> dict[str, Any] | None:
        """The saved epoch metrics, whose ``callback_metrics`` (put back into the trainer) are named tensors.

        Raises:
            ResumeMismatchError: they are not the mappings of tensors this library writes.
        """
        if saved is None:
            return None
        metrics = saved.get("callback_metrics", {}) if isinstance(saved, Mapping) else None
        if not isinstance(metrics, Mapping) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in metrics.items()
        ):
            raise ResumeMismatchError(
                f"Refusing to resume from {source or 'the checkpoint'}: its rank file's epoch_metrics entry is"
                " malformed (callback_metrics are not named tensors): not a file this library wrote."
            )
        return dict(saved)

    @staticmethod
    def _fetched_ahead_rng(saved: Any, source: str | None) -> dict[str, Any] | None:
        """The RNG streams from before the batch fetched ahead, or None where the save had none.

        Raises:
            ResumeMismatchError: the entry is there but not the mapping this library writes.
        """
        if saved is None:
            return None
        rng = saved.get("rng") if isinstance(saved, Mapping) else None
        if not isinstance(rng, Mapping) or not isinstance(rng.get("torch"), torch.Tensor):
            raise ResumeMismatchError(
                f"Refusing to resume from {source or 'the checkpoint'}: its rank file's fetched_ahead entry is"
                f" malformed ({type(saved).__name__} without RNG streams): not a file this library wrote."
            )
        return dict(rng)

    def _refuse_changed_loaders(self) -> None:
        """Refuse a resume whose train loaders were built with other settings than the saved ones,
        before the saved position is applied to them (where torchdata would fail on its own terms).

        Called once both sides are known: the loaders are handed out after the restore, or before it
        (``estimated_stepping_batches``, loaders given to ``fit``); every rank refuses alike.
        """
        saved, self._saved_loader_settings = self._saved_loader_settings, None
        if saved is None:
            return
        if not isinstance(saved, list) or not all(isinstance(entry, Mapping) for entry in saved):
            raise ResumeMismatchError(
                f"Refusing to resume from {self._resuming_from or 'the checkpoint'}: its train loader settings are"
                f" malformed ({type(saved).__name__}, not a list of mappings): not a file this library wrote."
            )
        changes = changed_loader_settings(saved, [a.settings for a in self.adoptions])
        if not changes:
            return
        raise ResumeMismatchError(
            f"Refusing to resume from {self._resuming_from or 'the checkpoint'}: the train loader changed since it"
            " was saved.\n" + "\n".join(f"  {change}" for change in changes) + "\nIts saved data position holds"
            " only for the settings it was saved with. Ways out: set them back to the checkpoint's values to resume"
            " exactly; or start a new run on purpose (ckpt_path=None), from its weights with"
            " lightning_field.load_weights() if you want them.",
            differences={"data.train_loader": changes},
        )

    def restore_on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Put the data position, sampler generators and epoch metrics back before the first fetch."""
        if trainer.ckpt_path is not None:
            internals.rerun_validation_skipped_on_resume(trainer, self._streams_before_validation_rerun)
            self._validation_rerun_in = trainer
        loaders = list(internals.iter_loaders(trainer.train_dataloader))
        # Saved at an epoch's end, Lightning either replays that end (then builds the next epoch's
        # iterator itself) or goes straight on with the iterator it built over the finished position,
        # which yields nothing: an epoch would be lost. Either way the next epoch draws its order,
        # and its workers' seeds, from the generators as they were saved, so those come first.
        restarted_at_epoch_end = trainer.fit_loop.restarted_on_epoch_end
        # Our own checkpoints say so themselves (and were rewritten to resume as the next epoch);
        # Lightning's stage covers checkpoints written before that.
        resumed_after_epoch_end = trainer.fit_loop.resumed_on_epoch_end or self._resumed_epoch_closed
        self._resumed_epoch_closed = False
        internals.undo_epoch_end_double_count(trainer)
        states, self._loaded_loader_states = self._loaded_loader_states, None
        samplers, self._loaded_sampler_state = self._loaded_sampler_state, []
        # A loader built before the restore (estimated_stepping_batches) never got Lightning's.
        unapplied = internals.unapplied_loader_states(trainer)
        prefetch_rng, self._pending_prefetch_rng = self._pending_prefetch_rng, None
        refetch = False
        if prefetch_rng is not None and states and internals.fetches_ahead(trainer):
            refetch = True
            # Saved while a batch fetched ahead waited: Lightning fetched it again while setting the
            # loop up, before any RNG was restored. It is fetched once more from the streams as they
            # were before the uninterrupted run fetched it; the saved ones follow (before_fetch).
            restore_rng_state(prefetch_rng, self.generators)
        internals.rebuild_resumed_iterator(trainer, states or [], samplers, force=unapplied or refetch)
        if unapplied:
            internals.forget_loader_states(trainer)
        if samplers:
            restore_sampler_generators(loaders, samplers)
        saved_metrics = (self._loaded_epoch_metrics or {}).get("callback_metrics")
        self._restore_epoch_metrics(trainer, pl_module, restarted_at_epoch_end or resumed_after_epoch_end)
        if resumed_after_epoch_end and states and internals.fetches_ahead(trainer):
            # Lightning's set-up fetched a batch ahead from the restored (finished) position; the
            # loaders go back to it before the streams are restored for the next epoch's start.
            internals.reopen_finished_epoch(trainer, states)
        if restarted_at_epoch_end or resumed_after_epoch_end or not self._prefetch_hook_installed:
            self.before_fetch()
            self._pending_rng = None
        if resumed_after_epoch_end and states:
            internals.start_next_epoch_iterator(trainer)
        if saved_metrics:
            internals.restore_callback_metrics(trainer, saved_metrics, pl_module.device)
            if resumed_after_epoch_end:
                internals.step_plateau_schedulers_missed_at_epoch_end(trainer)
        mid_epoch = trainer.fit_loop.epoch_loop.batch_progress.current.ready > 0
        if trainer.ckpt_path is not None and mid_epoch and not (restarted_at_epoch_end or resumed_after_epoch_end):
            unknown = internals.replay_resumed_epoch_start(trainer, pl_module)
            if unknown:
                rank_zero_warn(
                    f"lightning_field: resumed mid-epoch with {', '.join(sorted(unknown))}, whose on_train_epoch_start"
                    " Lightning does not call again for the resumed epoch. If it builds state there that its"
                    " state_dict does not restore (StochasticWeightAveraging's scheduler is rebuilt by"
                    " lightning_field), this continuation is not exact: resume from an epoch's end instead."
                )

    def _restore_epoch_metrics(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, resumed_at_epoch_end: bool
    ) -> None:
        saved, self._loaded_epoch_metrics = self._loaded_epoch_metrics, None
        if not saved:
            return
        skip = [
            *(saved.get("reset_at_epoch_end", []) if resumed_at_epoch_end else []),
            *saved.get("reset_after_validation", []),
        ]
        gone = restore_torchmetrics(pl_module, saved.get("torchmetrics", {}), skip)
        if gone:
            rank_zero_warn(f"Saved torchmetrics state for {gone} has no metric to go to in this module")
        # A closed epoch's values were logged by the attempt that closed it: nothing to carry over.
        mid_epoch = not resumed_at_epoch_end and trainer.fit_loop.epoch_loop.batch_progress.current.ready > 0
        if mid_epoch and saved.get("logged"):
            self._logged_value_merge = LoggedValueMerge(saved["logged"])

    def _streams_before_validation_rerun(self) -> None:
        # The validation the saved step was followed by draws from the saved streams; the train
        # fetch after it draws from what it leaves, as in the uninterrupted run.
        self.before_fetch()
        self._pending_rng = None

    def before_fetch(self) -> None:
        """Put this rank's saved RNG streams back before a fetch of the resumed train loader.

        Called before every fetch *attempt* until a batch actually arrives: a resumed epoch that is
        already exhausted attempts one fetch that only raises StopIteration.
        """
        if self._pending_rng is not None:
            unrestored = restore_rng_state(self._pending_rng, self.generators)
            if unrestored:
                rank_zero_warn(f"Could not restore RNG state for {unrestored}: the continuation may differ")

    # ------------------------------------------------------------------ training
    def batch_started(self) -> None:
        self._pending_rng = None

    def epoch_ended(self) -> None:
        """The resumed epoch is over: a stream's loaded position applies to no later one."""
        self._stream_positions_active.zero_()

    def batch_ended(self, trainer: pl.Trainer, batch: Any) -> None:
        self._count_batch(batch)
        if self._logged_value_merge:
            self._logged_value_merge.merge(trainer)
        # Host-side copy (~50 µs, no device sync): validation may follow this batch, and its loader
        # draws from the global generators before any validation hook runs. An exception save in
        # the next step saves it as this step's streams (``rng_at_batch_end``).
        self.rng_at_batch_end = capture_rng_state(self.generators)

    def _count_batch(self, batch: Any) -> None:
        # Shapes are host metadata: counting does not synchronise the device. A tensor, or a tuple or
        # list led by one or a dict whose first value is one, is sized as extract_batch_size sizes it,
        # without its walk (~25 µs a step).
        first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
        if type(batch) is dict and batch:
            first = next(iter(batch.values()))  # extract_batch_size too takes a dict's first tensor value
        if isinstance(first, torch.Tensor) and first.ndim > 0:
            self.samples_seen += first.shape[0]
        else:
            try:
                self.samples_seen += extract_batch_size(batch)
            except Exception:  # an exotic batch without a discoverable size is simply not counted
                return
        if type(batch) is dict or isinstance(batch, Mapping):
            ids = batch.get("input_ids")
            if isinstance(ids, torch.Tensor):
                self.tokens_seen = (self.tokens_seen or 0) + ids.numel()

    # ------------------------------------------------------------------ saving
    def capture(
        self,
        trainer: pl.Trainer,
        checkpoint: dict[str, Any],
        weights_only: bool,
        rewound: tuple[PositionBeforeFetch, dict[str, Any]] | None = None,
    ) -> tuple[dict[str, Any], list[str]]:
        """This rank's file of a checkpoint and what it lacks (see ``capture_rank_state``).

        ``rewound``: for a save made after the step it holds (``checkpoint.exception_save``), the
        loaders' position from before the next batch's fetch and the RNG streams at that step's end.

        The first save without a data position says so, once per run and loudly: a resume from it
        (and from every later one) could not continue exactly.
        """
        fetched_ahead, unseen = self.prefetched.at_save(trainer)
        rng = capture_rng_state(self.generators)
        if rewound is not None:
            position, rng = rewound
            internals.set_saved_loader_states(checkpoint, position.loader_states)
            fetched_ahead, unseen = (position if internals.fetches_ahead(trainer) else None), None
        elif fetched_ahead is not None:
            internals.set_saved_loader_states(checkpoint, fetched_ahead.loader_states)
        state, missing = capture_rank_state(
            trainer,
            checkpoint,
            rng,
            weights_only=weights_only,
            samples_seen=self.samples_seen,
            tokens_seen=self.tokens_seen,
            adoptions=self.adoptions,
            sees_fetches=self._prefetch_hook_installed,
        )
        if fetched_ahead is not None:
            state["fetched_ahead"] = {"rng": fetched_ahead.rng}
        if unseen is not None:
            missing.append(f"data_position (rank {trainer.global_rank}: {unseen})")
        unresumable = next((reason for reason in missing if reason.startswith("data_position")), None)
        if unresumable is not None and not self._told_unresumable:
            self._told_unresumable = True
            rank_zero_warn(
                f"lightning_field: this checkpoint and every later one are NOT recoverable: {unresumable}. A"
                " resume could not continue exactly. Fix it as said; `field ckpt inspect` shows what is missing."
            )
        return state, missing
