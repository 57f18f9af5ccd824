"""The no-progress guard: a crash loop (a module that raises at step 23 every attempt) ends with exit
status 77 and a message naming the step, the exception and the attempts; progress starts the count over.

Real child processes (tests/jobs/no_progress_job.py), rerun in one run directory with ckpt_path="last".
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import TESTS_DIR, run_child

from lightning_field import NO_PROGRESS_EXIT_CODE, PREEMPTED_EXIT_CODE, read_events
from lightning_field.checkpoint.no_progress import RETRY_ENV, NoProgressError, failed_attempts_without_progress
from lightning_field.profiling import HANG_EXIT_CODE

pytestmark = pytest.mark.slow  # child processes, except the last test's pure function

JOB = TESTS_DIR / "jobs" / "no_progress_job.py"


def attempt(root: Path, *extra: object) -> tuple[int, str]:
    result = run_child([JOB, "--root", root, "--no-snapshots", *map(str, extra)], timeout=180)
    return result.returncode, result.stdout


def test_the_exit_code_is_distinct_from_preempted_and_hang_and_is_a_system_exit() -> None:
    assert NO_PROGRESS_EXIT_CODE == 77 and len({NO_PROGRESS_EXIT_CODE, PREEMPTED_EXIT_CODE, HANG_EXIT_CODE}) == 3
    error = NoProgressError(20, [])
    assert isinstance(error, SystemExit) and error.code == 77 and not isinstance(error, Exception)


def test_a_step_that_fails_every_attempt_is_refused_at_the_fourth_with_exit_77_naming_step_exception_attempts(
    tmp_path: Path,
) -> None:
    root = tmp_path / "run"
    for _ in range(3):
        rc, out = attempt(root, "--fail-at-step", 23)
        assert rc == 1, out[-3000:]
        assert "RuntimeError: injected failure in training step 23" in out
    rc, out = attempt(root, "--fail-at-step", 23)
    assert rc == NO_PROGRESS_EXIT_CODE, out[-3000:]
    assert "TRAIN-START step=22" in out and "Traceback" not in out
    assert (
        "3 attempts in a row (1, 2, 3) resumed from step 22 (or started before it) and failed before committing"
        " a checkpoint past it, each with RuntimeError in step 23: injected failure in training step 23" in out
    )
    assert "Refusing to train attempt 4 from step 22" in out and RETRY_ENV in out
    events = read_events(root)
    failed = [e for e in events if e["event"] == "attempt_failed"]
    assert [(e["attempt"], e["payload"]["step"], e["payload"]["failed_step"]) for e in failed] == [
        (1, 22, 23), (2, 22, 23), (3, 22, 23),
    ]  # fmt: skip
    assert {e["payload"]["exception"] for e in failed} == {"RuntimeError"}
    assert [e["step"] for e in events if e["event"] == "ckpt_load"] == [22, 22, 22]  # attempts 2-4 resumed there
    ends = [(e["attempt"], e["payload"]["status"]) for e in events if e["event"] == "attempt_end"]
    assert ends[-1] == (4, "refused: no progress")
    # A refused attempt trains nothing and counts nothing: a launcher restarting anyway is refused again, fast.
    rc, out = attempt(root, "--fail-at-step", 23)
    assert rc == NO_PROGRESS_EXIT_CODE and "(1, 2, 3)" in out and "attempt 5" in out


def test_a_commit_past_the_step_starts_the_count_over(tmp_path: Path) -> None:
    root = tmp_path / "run"
    for _ in range(2):
        assert attempt(root, "--fail-at-step", 23)[0] == 1
    # The cause moved on (data, a flaky dependency): this attempt commits steps 25 and 30, then fails in 33.
    assert attempt(root, "--fail-at-step", 33)[0] == 1
    for _ in range(2):  # only attempt 3 counted at the start of 4, attempts 3 and 4 at the start of 5
        rc, out = attempt(root, "--fail-at-step", 33)
        assert rc == 1 and "TRAIN-START step=32" in out, out[-3000:]
    rc, out = attempt(root, "--fail-at-step", 33)
    assert rc == NO_PROGRESS_EXIT_CODE and "(3, 4, 5) resumed from step 32" in out, out[-3000:]


def test_the_retry_variable_allows_one_more_attempt_and_no_second(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "run"
    codes = [attempt(root, "--fail-at-step", 3, "--max-failed-attempts", 2)[0] for _ in range(3)]
    assert codes == [1, 1, NO_PROGRESS_EXIT_CODE]
    monkeypatch.setenv(RETRY_ENV, "1")
    rc, out = attempt(root, "--fail-at-step", 3, "--max-failed-attempts", 2)
    assert rc == 1 and "RuntimeError: injected failure in training step 3" in out, out[-3000:]
    rc, out = attempt(root, "--fail-at-step", 3, "--max-failed-attempts", 2)  # the variable still set
    assert rc == NO_PROGRESS_EXIT_CODE and "(1, 2, 4)" in out, out[-3000:]
    assert [e["attempt"] for e in read_events(root) if e["event"] == "no_progress_retry"] == [4]


def test_changed_code_starts_the_count_over(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("# the user's code\n")
    git = ["git", "-C", str(code), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "train.py"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "v1"], check=True)
    root = tmp_path / "run"
    for _ in range(3):
        assert attempt(root, "--fail-at-step", 23, "--code-dir", code)[0] == 1
    assert attempt(root, "--fail-at-step", 23, "--code-dir", code)[0] == NO_PROGRESS_EXIT_CODE
    (code / "train.py").write_text("# the user's code, fixed\n")
    subprocess.run([*git, "commit", "-q", "-am", "the fix"], check=True)
    # The checkpoint was written by other code: its resume needs allowing; the guard lets it train.
    rc, out = attempt(root, "--fail-at-step", 23, "--code-dir", code, "--allow-code-change")
    assert rc == 1 and "RuntimeError: injected failure in training step 23" in out, out[-3000:]


def test_plain_lightning_redoes_the_same_steps_and_fails_at_the_same_one_every_attempt(tmp_path: Path) -> None:
    root = tmp_path / "run"
    starts = []
    for _ in range(5):
        rc, out = attempt(root, "--fail-at-step", 23, "--checkpoint", "plain")
        assert rc == 1 and "RuntimeError: injected failure in training step 23" in out, out[-3000:]
        starts += [int(line.split("=")[1]) for line in out.splitlines() if line.startswith("TRAIN-START")]
    # Every restart resumes from step 20 and dies in step 23: five attempts, no end in sight.
    assert starts == [0, 20, 20, 20, 20]


def log_of(*attempts: tuple[list[tuple[str, int | None]], dict | None]) -> list[dict]:
    events = []
    for number, (steps, failed) in enumerate(attempts, start=1):
        events += [{"attempt": number, "event": name, "step": step, "payload": {}} for name, step in steps]
        if failed is not None:
            events.append({"attempt": number, "event": "attempt_failed", "step": failed["step"], "payload": failed})
    return events


def test_attempts_that_never_trained_or_ran_other_code_are_passed_over_or_end_the_count() -> None:
    boom = {"step": 20, "exception": "RuntimeError", "message": "x", "code": "a"}
    log = log_of(
        ([("fit_start", 0), ("ckpt_committed", 20)], boom),
        ([], {**boom, "step": 0}),  # failed in start-up, before training: not counted
        ([("fit_start", 20)], boom),
        ([("fit_start", 20)], None),  # killed without a trace: passed over
        ([("fit_start", 20)], {**boom, "exception": "KeyboardInterrupt"}),  # Ctrl-C: a person, not the code
    )
    assert [a.attempt for a in failed_attempts_without_progress(log, 20, "a", current=6)] == [1, 3]
    assert [a.attempt for a in failed_attempts_without_progress(log, 20, "b", current=6)] == []  # code changed
    assert failed_attempts_without_progress(log, 25, "a", current=6) == []  # resumed elsewhere


def test_attempts_the_hang_watchdog_ended_count_as_failures_with_the_code_their_fit_start_recorded() -> None:
    def hung(step: int, code: str) -> list[tuple[str, int | None, dict]]:
        report = {"culprits": [{"rank": 1, "host": "node-2", "step": step, "phase": "FORWARD"}], "no_progress_s": 9}
        return [("fit_start", step, {"code": code}), ("hang", step + 5, report)]

    def log(*attempts: list[tuple[str, int | None, dict]]) -> list[dict]:
        return [{"attempt": number, "event": name, "step": step, "payload": payload}
                for number, events in enumerate(attempts, start=1) for name, step, payload in events]  # fmt: skip

    counted = failed_attempts_without_progress(log(hung(10, "a"), hung(10, "a")), 10, "a", current=3)
    assert [(a.attempt, a.step, a.exception) for a in counted] == [(1, 15, "Hang"), (2, 15, "Hang")]
    assert counted[0].describe() == "Hang in step 16: rank 1 on node-2 stopped in the training step (forward)"
    assert failed_attempts_without_progress(log(hung(10, "a"), hung(10, "b")), 10, "b", current=3)[0].attempt == 2
    # A finished attempt in between ends the count, as it does for exceptions.
    # The watchdog stood down (the rank moved again): that hang ended nothing, whatever ended the attempt.
    resolved = [*hung(10, "a"), ("hang_resolved", 15, {"rank": 1, "stalled_s": 40.0})]
    assert failed_attempts_without_progress(log(hung(10, "a"), resolved), 10, "a", current=3)[0].attempt == 1
    assert len(failed_attempts_without_progress(log(resolved, resolved), 10, "a", current=3)) == 0
    # A report others rewrote (culprits not a list) reads as no rank named, not a crash.
    forged = [("fit_start", 10, {"code": "a"}), ("hang", 15, {"culprits": 5, "ranks": True})]
    assert failed_attempts_without_progress(log(forged), 10, "a", current=2)[0].message == "no rank named"
    finished: list[tuple[str, int | None, dict]] = [("fit_start", 10, {"code": "a"}),
                                                    ("attempt_end", None, {"status": "finished"})]  # fmt: skip
    after_a_finish = failed_attempts_without_progress(log(hung(10, "a"), finished, hung(10, "a")), 10, "a", current=4)
    assert [a.attempt for a in after_a_finish] == [3]


def test_over_two_ranks_every_rank_refuses_alike_and_the_job_exits_77(tmp_path: Path) -> None:
    root = tmp_path / "run"
    args = ["--fail-at-step", 23, "--devices", 2]
    assert [attempt(root, *args)[0] for _ in range(3)] == [1, 1, 1]
    rc, out = attempt(root, *args)
    assert rc == NO_PROGRESS_EXIT_CODE, out[-3000:]
    # Over several ranks no resume point is saved at the exception: each attempt resumed from step 20.
    assert out.count("TRAIN-START step=20") == 2 and "(1, 2, 3) resumed from step 20" in out
