"""Exact resume on the Trainers users already have: each ordinary Lightning configuration is run
uninterrupted, SIGKILLed mid-training, then rerun with ``ckpt_path="last"``, and the final weights,
optimizer state, LR schedulers, callback state and logged epoch metrics must be bitwise equal to the
uninterrupted run's. Plain ModelCheckpoint on the same code is in test_conformance_plain.py.

Where a configuration cannot resume exactly, the bundle must say so and refuse: it is listed in
REFUSED with the reason its checkpoints carry, and the resume must stop with that reason instead of
continuing inexactly or starting over.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conformance import CONFIGS, interrupted_exit_status, run_protocol

from lightning_field.core.events import read_events

pytestmark = pytest.mark.slow  # every test here starts processes (tests/suite_budget.py)

# Configurations whose checkpoints are (correctly) not recoverable: the reason they must carry.
REFUSED = {
    "iterable-dataset": "StatefulDataLoader over StreamDataset streams an IterableDataset without a state_dict",
    "hf-buffer-shuffle": "shuffle(buffer_size=16) keeps a shuffle buffer that its state_dict does not hold",
    "webdataset": "DataLoader over WebDataset streams an IterableDataset without a state_dict",
}

# Configurations rerun with a train-loader setting changed: refused before training, the setting named.
CHANGED = {
    "changed-num-workers-2-to-0": "num_workers: 2 (checkpoint) -> 0 (now)",
    "changed-num-workers-0-to-2": "num_workers: 0 (checkpoint) -> 2 (now)",
    "changed-batch-size": "batch_size: 8 (checkpoint) -> 4 (now)",
    "changed-drop-last": "drop_last: False (checkpoint) -> True (now)",
    "changed-sampler": "sampler: 'RandomSampler' (checkpoint) -> 'SequentialSampler' (now)",
    # Trainer settings (state/trainer_settings.py), refused the same way
    "changed-accumulate-grad-batches": "accumulate_grad_batches: 2 (checkpoint) -> 4 (now)",
    "changed-limit-train-batches": "limit_train_batches: 0.5 (checkpoint) -> 0.75 (now)",
    "changed-val-check-interval": "val_check_interval: 0.5 (checkpoint) -> 0.25 (now)",
}

# Configurations rerun with a Trainer setting changed that ManifestCheckpoint(allow_changed=...) allows: the
# rerun resumes where the save was, says so, and every checkpoint it commits records that its lineage is no
# longer exact; it differs from the uninterrupted run (that is why it is marked), so it is not judged bitwise.
ALLOWED = {"changed-accumulate-allowed": "accumulate_grad_batches: 2 (checkpoint) -> 4 (now)"}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_killed_run_resumes_bitwise_identically_or_refuses_with_the_reason(
    name: str, tmp_path: Path, shared_shards: Path
) -> None:
    outcome = run_protocol(name, "field", tmp_path, shared_shards)
    # A SIGKILLed process ends -9; a SIGTERMed one saves and ends with TrainingPreempted's 75; one that
    # stopped before its limits (max_time, should_stop) ends 0.
    assert outcome.killed_rc == interrupted_exit_status(name), outcome.error
    if name in CHANGED:
        assert outcome.error is not None and "Refusing to resume" in outcome.log, outcome.summary()
        assert CHANGED[name] in outcome.log, outcome.log[-3000:]
        assert "conformance: training starts" not in outcome.log, "the refusal came after training began"
        assert "Traceback" not in outcome.log.split("ResumeMismatchError")[-1], "another error followed the refusal"
        return
    if name in REFUSED:
        assert outcome.error is not None and "none recoverable" in outcome.log, outcome.summary()
        assert REFUSED[name] in outcome.log
        return
    config = CONFIGS[name]
    if name in ALLOWED:
        assert outcome.error is None, f"{outcome.error}\n{outcome.log[-3000:]}"
        assert ALLOWED[name] in outcome.log and "no longer exact" in outcome.log, outcome.log[-3000:]
        # From the newest save before the kill (a persistent checkpoint or, where they are on, a snapshot).
        assert 0 < (outcome.resumed_from_step or 0) <= config.kill_at, f"resumed at {outcome.resumed_from_step}"
        assert outcome.inexact_lineage and all(outcome.inexact_lineage), "a later manifest calls the lineage exact"
        assert outcome.differences, "the changed setting changed nothing: the row proves nothing"
        return
    if config.finished_rerun:
        # The same command after the run finished: it trains no step, says why, and holds the stopped state.
        assert outcome.error is None, f"{outcome.error}\n{outcome.log[-3000:]}"
        assert outcome.trained_batches == 0 and "conformance: training starts" not in outcome.log, outcome.summary()
        assert not outcome.differences, "\n".join(outcome.differences[:10])
        assert outcome.resumed_from_step == outcome.stopped_at_step, f"holds step {outcome.resumed_from_step}"
        said = f"training had already stopped at step {outcome.stopped_at_step} (EarlyStopping on val_loss)"
        said += "; nothing to do"
        assert said in outcome.log, outcome.log[-3000:]
        events = read_events(tmp_path / "field-interrupted")
        assert [e["step"] for e in events if e["event"] == "fit_already_finished"] == [outcome.stopped_at_step]
        return
    assert outcome.error is None, f"{outcome.error}\n{outcome.log[-3000:]}"
    assert outcome.resumed_from_step, "the rerun started over from step 0"
    assert not outcome.differences, "\n".join(outcome.differences[:10])
    if outcome.stopped_at_step is not None:
        assert outcome.resumed_from_step == outcome.stopped_at_step, "the rerun did not resume where the run stopped"
        assert "nothing to do" not in outcome.log, "a rerun with larger limits or without the stopper did nothing"
    if config.damage_newest_snapshot:
        # The damaged newest snapshot is skipped, by name, for the step before it (a snapshot or persistent).
        damaged = re.search(r"conformance: damaged epoch=\d+-step=(\d+)", outcome.log)
        assert damaged is not None and f"step={damaged.group(1)}" in outcome.log.split("Skipping checkpoint")[1]
        assert outcome.resumed_from_step == int(damaged.group(1)) - 1, f"resumed at {outcome.resumed_from_step}"
    elif config.lose_node:
        # The lost node's snapshot directory was deleted: its ranks' files of any step after the last
        # persistent save existed only as replicas on the surviving node, which sent them to the new one.
        assert "received what they lacked from other nodes" in outcome.log, outcome.log[-3000:]
        last_persistent = config.kill_at // config.every_n_train_steps * config.every_n_train_steps
        assert outcome.resumed_from_step > last_persistent, f"resumed at {outcome.resumed_from_step}"
        # The newest snapshot's commit needs every rank; the lost node may have stopped inside it.
        assert outcome.resumed_from_step >= config.kill_at - 2, f"resumed at {outcome.resumed_from_step}"
    elif config.snapshot_every == 1 and config.snapshot_in_line is False:
        # The snapshot of the step before the kill may still be committing: at most one step is redone.
        assert outcome.resumed_from_step >= config.kill_at - 1, f"resumed at {outcome.resumed_from_step}"
    elif config.snapshot_every == 1:
        # Committed in line (the default on CPU): the step the kill interrupted is the only work lost.
        assert outcome.resumed_from_step == config.kill_at, f"resumed at {outcome.resumed_from_step}"
    if config.model == "sharded" and config.snapshot_every is not None:
        # Each rank's DCP load read its own node's snapshot folder (another node's is not there on a
        # real machine), the replacement node's included.
        reads = re.findall(r"conformance: rank (\d+) on (\S+) reads shards from (\S+)", outcome.log)
        assert {rank for rank, _, _ in reads} == {"0", "1"}, outcome.log[-3000:]
        assert all(f"/snapshots/{node}/" in path for _, node, path in reads), reads
    if name == "snapshots-auto":
        # No persistent checkpoint before the kill: the default snapshots, taken every step while their
        # cost is measured, are what it resumed from, at the step the kill interrupted.
        assert outcome.resumed_from_step == config.kill_at, f"resumed at {outcome.resumed_from_step}"
    if config.interrupt == "SIGINT":
        # Ctrl-C at step 6's start: that step was finished and saved, then the attempt ended.
        assert outcome.resumed_from_step == config.kill_at + 1, f"resumed at {outcome.resumed_from_step}"
        assert f"interrupted-step={config.kill_at + 1}" in outcome.log, outcome.log[-3000:]  # what it restored
    if config.fault == "raise":
        # The failed step is the only one redone: its state was still step 6's end, and was saved.
        assert outcome.resumed_from_step == config.kill_at, f"resumed at {outcome.resumed_from_step}"
        assert f"failed-step={config.kill_at}" in outcome.log, outcome.log[-3000:]  # what it restored
