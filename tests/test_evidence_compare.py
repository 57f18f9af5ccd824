"""The comparison and verdict as pure functions of step records: which component, which step, which verdict."""

from __future__ import annotations

import torch

from lightning_field.evidence.compare import (
    EXACT,
    FAIL,
    WITHIN_NOISE,
    compare_run,
    decide,
    effective_records,
    first_divergence,
)


def record(step: int, attempt: int = 1, **changes: object) -> dict:
    base = {"epoch": 0, "batch_idx": step - 1, "step": step, "step_before": step - 1, "attempt": attempt,
            "rng": f"r{step}", "batch": f"b{step}", "weights": f"w{step}", "optimizer": f"o{step}",
            "loss": 1.0 / step}  # fmt: skip
    return {**base, **changes}


def run(records: list[dict]) -> dict:
    return {0: effective_records(records)}


FINAL = {"weights": {"w": torch.ones(3)}, "optimizer": [{"state": {}}], "schedulers": []}


def test_a_later_attempt_replaces_the_steps_the_killed_attempt_had_already_done() -> None:
    records = [record(s) for s in range(1, 6)] + [record(4, attempt=2, loss=9.0), record(5, attempt=2)]
    effective = effective_records(records)
    assert [k for k in effective] == [(0, i) for i in range(5)]
    assert effective[(0, 3)]["loss"] == 9.0 and effective[(0, 3)]["attempt"] == 2


def test_first_divergence_names_the_earliest_step_and_components_in_causal_order() -> None:
    reference = run([record(s) for s in range(1, 9)])
    other = [record(s) for s in range(1, 9)]
    other[5] = record(6, rng="x", batch="y", loss=0.5)
    other[6] = record(7, weights="z")
    divergence = first_divergence(reference, run(other))
    assert divergence is not None and divergence.step == 6
    assert divergence.components == ["rng", "data", "loss"] and divergence.to_dict()["component"] == "RNG"
    assert first_divergence(reference, reference) is None


def test_identical_runs_are_exact_and_any_difference_with_bitwise_controls_fails() -> None:
    reference = run([record(s) for s in range(1, 9)])
    controls = compare_run("control-2", reference, reference, FINAL, FINAL)
    same = compare_run("interrupted-1", reference, reference, FINAL, FINAL, resume_step=4)
    assert decide(controls, [same], 3.0).verdict == EXACT

    shifted = run([record(s) if s < 6 else record(s, loss=record(s)["loss"] + 1e-7) for s in range(1, 9)])
    tiny = compare_run("interrupted-1", reference, shifted, FINAL, FINAL, resume_step=4)
    verdict = decide(controls, [tiny], 3.0)
    assert verdict.verdict == FAIL and "step 6" in verdict.summary and tiny.divergence.primary == "loss"


def test_final_state_differences_count_even_when_every_step_record_matches() -> None:
    reference = run([record(s) for s in range(1, 5)])
    moved = {**FINAL, "weights": {"w": torch.tensor([1.0, 1.0, 1.5])}}
    controls = compare_run("control-2", reference, reference, FINAL, FINAL)
    other = compare_run("interrupted-1", reference, reference, FINAL, moved, resume_step=2)
    assert decide(controls, [other], 3.0).verdict == FAIL
    assert other.final.weights_max_abs_diff == 0.5 and other.final.components == ["weights"]


def test_with_noisy_controls_the_verdict_depends_on_the_size_of_the_difference() -> None:
    reference = run([record(s) for s in range(1, 11)])

    def offset(by: float) -> dict:
        return run([record(s, loss=record(s)["loss"] + by) for s in range(1, 11)])

    def final(by: float) -> dict:
        return {**FINAL, "weights": {"w": torch.ones(3) + by}}

    controls = compare_run("control-2", reference, offset(0.01), FINAL, final(0.01))
    close = compare_run("interrupted-1", reference, offset(0.02), FINAL, final(0.02), resume_step=5)
    far = compare_run("interrupted-2", reference, offset(0.5), FINAL, final(0.02), resume_step=5)
    verdict = decide(controls, [close], 3.0)
    assert verdict.verdict == WITHIN_NOISE and not verdict.reproducible
    assert "not reproducible even without interruption" in controls.findings[0]
    assert decide(controls, [close, far], 3.0).verdict == FAIL and far.verdict == FAIL and close.verdict == WITHIN_NOISE


def test_a_continuation_that_skips_a_batch_is_a_data_position_divergence_not_a_gap() -> None:
    reference = run([record(s) for s in range(1, 9)])
    killed = [record(s) for s in range(1, 7)]  # killed after step 6; resumed from the checkpoint of step 4
    # ...but the resumed loader started one batch too far: batch index 5 is trained as step 5.
    resumed = [record(s, attempt=2, batch_idx=s, batch=f"b{s + 1}") for s in range(5, 9)]
    other = run(killed + resumed)
    assert (0, 4) not in other[0]  # the killed attempt's record of that batch no longer stands in for it
    divergence = first_divergence(reference, other)
    assert divergence is not None and divergence.step == 5 and divergence.primary == "position"


def test_with_gradient_accumulation_the_batch_before_the_checkpoint_is_kept() -> None:
    def accumulated(batch_idx: int, attempt: int = 1) -> dict:
        return {
            **record(1, attempt=attempt, batch_idx=batch_idx),
            "step": (batch_idx + 1) // 2,
            "step_before": batch_idx // 2,
        }

    killed = [accumulated(i) for i in range(7)]  # checkpoint after batch 3 (step 2), killed after batch 6
    resumed = [accumulated(i, attempt=2) for i in range(4, 10)]
    effective = effective_records(killed + resumed)
    assert [key[1] for key in effective] == list(range(10))
    assert [effective[(0, i)]["attempt"] for i in range(10)] == [1] * 4 + [2] * 6


def test_in_a_noisy_run_an_rng_difference_the_controls_do_not_show_still_fails() -> None:
    reference = run([record(s) for s in range(1, 11)])
    noisy = run([record(s, loss=record(s)["loss"] + 0.01) for s in range(1, 11)])
    broken = run([record(s, loss=record(s)["loss"] + 0.01, rng="other" if s > 5 else f"r{s}") for s in range(1, 11)])
    controls = compare_run("control-2", reference, noisy, FINAL, FINAL)
    run_cmp = compare_run("interrupted-1", reference, broken, FINAL, FINAL, resume_step=5)
    assert decide(controls, [run_cmp], 3.0).verdict == FAIL
    assert "a resume bug, not numerical noise" in run_cmp.findings[0] and run_cmp.structural.step == 6


def test_runs_without_a_loss_are_judged_on_their_final_state_alone() -> None:
    reference = run([record(s, loss=None) for s in range(1, 6)])
    controls = compare_run("control-2", reference, reference, FINAL, {**FINAL, "weights": {"w": torch.ones(3) + 0.1}})
    far = compare_run("interrupted-1", reference, reference, FINAL, {**FINAL, "weights": {"w": torch.ones(3) + 1}}, 2)
    assert far.deviation_loss is None and decide(controls, [far], 3.0).verdict == FAIL


def test_the_scheduler_and_torchmetrics_states_are_components_of_their_own() -> None:
    import torchmetrics
    from torch import nn

    from lightning_field.evidence.digest import metric_state_digest

    module = nn.Module()
    module.mean = torchmetrics.MeanMetric()
    before = metric_state_digest(module)
    module.mean.update(torch.tensor(2.0))
    assert metric_state_digest(module) != before, "an epoch metric's accumulated state is digested"
    assert metric_state_digest(nn.Linear(2, 2)) is None, "no metric, no field"
    reference = {0: {(0, 3): {"step": 4, "weights": "w", "scheduler": "s4", "metrics": "m4", "loss": 0.5}}}
    other = {0: {(0, 3): {"step": 4, "weights": "w", "scheduler": "s3", "metrics": "m0", "loss": 0.5}}}
    divergence = first_divergence(reference, other)
    assert divergence is not None and divergence.components == ["scheduler", "metrics"]
    assert divergence.describe() == "step 4 (epoch 0, batch 3, rank 0): scheduler, logged metrics"
