"""Exact resume on the Trainers users already have: each ordinary Lightning configuration is run
uninterrupted, SIGKILLed mid-training, then rerun with ``ckpt_path="last"``, and the final weights,
optimizer state, LR schedulers, callback state and logged epoch metrics must be bitwise equal to the
uninterrupted run's. Plain ModelCheckpoint on the same code is in test_conformance_plain.py.

Where a configuration cannot resume exactly, the bundle must say so and refuse: it is listed in
REFUSED with the reason its checkpoints carry, and the resume must stop with that reason instead of
continuing inexactly or starting over.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conformance import CONFIGS, run_protocol

# Configurations whose checkpoints are (correctly) not recoverable: the reason they must carry.
REFUSED = {
    "iterable-dataset": "has no length, so Lightning fetches a batch ahead",
    "iterable-dataset-with-state": "has no length, so Lightning fetches a batch ahead",
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_killed_run_resumes_bitwise_identically_or_refuses_with_the_reason(name: str, tmp_path: Path) -> None:
    outcome = run_protocol(name, "field", tmp_path)
    # A SIGKILLed process ends -9; a SIGTERMed one saves and ends with TrainingPreempted's 75.
    assert outcome.killed_rc == (75 if CONFIGS[name].interrupt == "SIGTERM" else -9), outcome.error
    if name in REFUSED:
        assert outcome.error is not None and "none recoverable" in outcome.log, outcome.summary()
        assert REFUSED[name] in outcome.log
        return
    assert outcome.error is None, f"{outcome.error}\n{outcome.log[-3000:]}"
    assert outcome.resumed_from_step, "the rerun started over from step 0"
    assert not outcome.differences, "\n".join(outcome.differences[:10])
