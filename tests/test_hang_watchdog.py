"""The hang watchdog (Issue 40 item 3): a rank stuck inside a step is named and the job ends with 76.

The real cases are two-rank DDP jobs on gloo started as users start them (``python hang_job.py``:
Lightning's launcher starts rank 1), beside the control (plain Lightning with
``StragglerMonitor(policy="checkpoint_and_stop")``, the issue's case, which does not end by itself);
the rule and the verdict are tested on made-up numbers, the grace with the monitor's threads alone.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import child_env, python_program, run_child

from lightning_field.core.events import EventLog
from lightning_field.core.heartbeat import rank_heartbeat_path, rank_stacks_path, read_rank_record
from lightning_field.profiling.hang_monitor import HangMonitor, Job, Progress
from lightning_field.profiling.hang_rule import HangRule, Phase, RankView, StepHistory, judge
from lightning_field.profiling.throughput import host_name
from lightning_field.profiling.watchdog import HANG_EXIT_CODE, HangWatchdog

JOB = Path(__file__).parent / "jobs" / "hang_job.py"
FLOOR_S, GRACE_S, HANG_STEP = 2.0, 2.0, 15
SLEEP_LINE = next(n for n, line in enumerate(JOB.read_text().splitlines(), 1) if "time.sleep(600)" in line)
"""The line of the sleeping frame (rank 1's ``training_step``), which the stacks must show."""


# ---------------------------------------------------------------------- the real hung job
@dataclass
class Hung:
    root: Path
    result: subprocess.CompletedProcess[str]
    wall_s: float
    """From the start of ``python hang_job.py`` to its end."""
    hang_to_end_s: float
    """From rank 1 falling asleep inside its step to the job's end."""


def _command(root: Path, *extra: object) -> list[object]:
    return [JOB, "--root", root, "--hang-step", HANG_STEP, "--floor", FLOOR_S, "--grace", GRACE_S, *extra]


@pytest.fixture(scope="module")
def hung(tmp_path_factory: pytest.TempPathFactory) -> Hung:
    root = tmp_path_factory.mktemp("hung")
    started = time.monotonic()
    result = run_child(_command(root), timeout=120)
    wall_s, ended = time.monotonic() - started, time.time()
    marker = root / "hang-started-rank1"
    assert marker.exists(), f"rank 1 never reached its hang (exit {result.returncode}):\n{result.stdout[-4000:]}"
    return Hung(root, result, wall_s, ended - float(marker.read_text()))


def _events(root: Path) -> list[dict]:
    path = root / "field" / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.slow
def test_a_rank_asleep_in_its_training_step_is_named_with_host_step_and_stack_and_the_job_exits_76_in_seconds(
    hung: Hung,
) -> None:
    out, host = hung.result.stdout, host_name()
    assert hung.result.returncode == HANG_EXIT_CODE == 76, out[-6000:]
    # The bar is 2 minutes; the floor plus the grace plus the polls is what it takes.
    assert hung.wall_s < 120, hung.wall_s
    assert FLOOR_S + GRACE_S - 0.5 < hung.hang_to_end_s < FLOOR_S + GRACE_S + 15, hung.hang_to_end_s

    # Rank 0 names rank 1, its host, the step and the phase, then rank 1's stacks: the sleeping frame.
    assert "HANG: no progress on rank 0 for " in out
    assert f"The job waits for: rank 1 on {host} (step {HANG_STEP}, in the training step (forward)" in out
    assert "Ending every rank in 2 s with exit status 76 (HANG_EXIT_CODE) so that the launcher restarts" in out
    shown = out[out.index("Stacks of rank 1 (") :]
    assert f'hang_job.py", line {SLEEP_LINE} in training_step' in shown
    assert "HANG: ending rank 0 with exit status 76" in out
    # Rank 1's own watchdog says so on its own stderr, with the same frame.
    assert f"HANG: this rank (1 on {host}) is the one the job waits for: step {HANG_STEP}" in out
    # Rank 0 names no other culprit.
    assert "The job waits for: rank 0" not in out

    # The run directory: the event, and every rank's stacks beside the heartbeats.
    (hang,) = [e for e in _events(hung.root) if e["event"] == "hang"]
    report = hang["payload"]
    assert hang["step"] == HANG_STEP and report["exit_status"] == 76 and report["detected_by"] == 0
    (culprit,) = report["culprits"]
    assert {k: culprit[k] for k in ("rank", "host", "step", "phase", "frozen")} == {
        "rank": 1, "host": host, "step": HANG_STEP, "phase": "FORWARD", "frozen": False,
    }  # fmt: skip
    assert f'hang_job.py", line {SLEEP_LINE} in training_step' in culprit["stacks"]
    assert culprit["stacks_file"] == str(rank_stacks_path(hung.root, 1))
    # The newest commit before the hang, of either tier: what the restart's ckpt_path="last" takes (the
    # restart test below checks that it does). Snapshots are on by default, at a machine-dependent interval.
    commits = [e for e in _events(hung.root) if e["event"] in ("ckpt_committed", "snapshot_committed")]
    newest = max(commits, key=lambda e: (e["step"], e["event"] == "ckpt_committed"))
    tier = "checkpoint" if newest["event"] == "ckpt_committed" else "resume point"
    assert f"(step {newest['step']}), the newest {tier} this attempt committed" in report["resume_point"]
    assert report["resume_point"].endswith("run the same command with ckpt_path='last'")
    assert report["save"].startswith("none attempted")
    for rank in (0, 1):
        assert "most recent call first" in rank_stacks_path(hung.root, rank).read_text()
    # Rank 1 was ended by the job, not by the test: its process is gone.
    record = read_rank_record(rank_heartbeat_path(hung.root, 1))
    assert record is not None
    assert _gone(record["pid"]), f"rank 1 (pid {record['pid']}) outlived the job"


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
def test_without_the_watchdog_the_same_hang_outlasts_twice_its_time_and_a_sigterm_to_rank_0_changes_nothing(
    hung: Hung, tmp_path: Path
) -> None:
    """The control: plain Lightning with ``StragglerMonitor(policy="checkpoint_and_stop")``, as the issue ran
    it. It is still running, silent, at twice the time the watchdog needed from the hang to the end."""
    bound_s = 2 * max(hung.hang_to_end_s, FLOOR_S + GRACE_S)
    log_path = tmp_path / "out.txt"
    with open(log_path, "w") as log_file:
        proc = subprocess.Popen(
            [python_program(), str(JOB), "--root", str(tmp_path), "--hang-step", str(HANG_STEP)],
            stdout=log_file, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True,
        )  # fmt: skip
    try:
        marker, deadline = tmp_path / "hang-started-rank1", time.monotonic() + 60
        while not marker.exists():
            assert proc.poll() is None, (
                f"the control ended ({proc.returncode}) before its hang:\n{log_path.read_text()}"
            )
            assert time.monotonic() < deadline, f"rank 1 never reached its hang:\n{log_path.read_text()[-4000:]}"
            time.sleep(0.2)
        hang_began = float(marker.read_text())
        time.sleep(1.0)  # rank 0 is in the gradient all-reduce by now
        proc.send_signal(signal.SIGTERM)  # the issue: "SIGTERM to rank 0 had no effect"
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=max(hang_began + bound_s - time.time(), 0.0))
        assert time.time() - hang_began >= bound_s
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    out = log_path.read_text()
    assert "HANG" not in out, out[-4000:]
    assert not [e for e in _events(tmp_path) if e["event"] in ("hang", "straggler")]
    assert not (tmp_path / "field" / "heartbeat" / "rank-00001-stacks.txt").exists()


@pytest.mark.slow
def test_a_restart_after_exit_76_resumes_from_the_newest_committed_checkpoint_and_finishes(hung: Hung) -> None:
    """76 means "restart the same command": no save is attempted at the hang (every other rank is blocked
    in the all-reduce that waits for the hung one), so the restart resumes from the last commit before it."""
    assert hung.result.returncode == 76
    result = run_child(_command(hung.root), timeout=120)
    assert result.returncode == 0, result.stdout[-6000:]
    assert "HANG" not in result.stdout
    for rank in (0, 1):
        done = json.loads((hung.root / f"result-rank{rank}.json").read_text())
        assert done["step"] == 40 and done["hangs"] == []
    events = _events(hung.root)
    # It resumes from the newest commit of the hung attempt: the step-10 checkpoint, or a step snapshot
    # after it (their interval is learned from their cost, so it depends on the machine's load).
    commits = ("ckpt_committed", "snapshot_committed")
    committed = max(e["step"] for e in events if e["attempt"] == 1 and e["event"] in commits)
    assert 10 <= committed <= HANG_STEP  # the hang is inside the step after HANG_STEP: its snapshot may be in
    assert [e["step"] for e in events if e["event"] == "fit_start"] == [0, committed]
    (hang,) = [e for e in events if e["event"] == "hang"]
    assert f"(step {committed}), the newest" in hang["payload"]["resume_point"]  # what the hang report named
    # The hung attempt left no attempt_end (it was ended from a thread): the next attempt_start marks it.
    assert [e["attempt"] for e in events if e["event"] == "attempt_start"] == [1, 2]


@pytest.mark.slow
def test_a_healthy_slow_uneven_run_with_a_long_first_batch_save_and_validation_finishes_with_no_hang_report(
    tmp_path: Path,
) -> None:
    slow_s = 3.5
    result = run_child([JOB, "--root", tmp_path, "--healthy", "--floor", FLOOR_S, "--steps", 30, "--slow-s", slow_s],
                       timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stdout[-6000:]
    assert "HANG" not in result.stdout
    assert not [e for e in _events(tmp_path) if e["event"].startswith("hang")]
    for rank in (0, 1):
        done = json.loads((tmp_path / f"result-rank{rank}.json").read_text())
        assert done["step"] == 30 and done["hangs"] == [], done
        closest = done["closest"]
        # The slow first batch is not in the window: the in-step timeout is learned from the steady ones.
        assert done["longest_batch_s"] < 1.0, done
        # The comparison that can fail: each slow phase went longer without progress than the in-step
        # timeout (or the floor, before a batch was timed) allows, and stayed under its own allowance.
        for phase in ("FORWARD", "SAVING", "VALIDATING"):
            age, timeout, step_timeout = closest[phase]
            assert max(step_timeout or 0.0, FLOOR_S) < age < timeout, (phase, closest[phase])
        # Between slow phases, the steady steps stayed well under their timeout.
        assert all(age < timeout / 2 for p, (age, timeout, _) in closest.items() if p in ("BACKWARD", "OPTIMIZER"))


@pytest.mark.slow
def test_a_job_that_hangs_at_the_same_step_every_attempt_is_refused_at_the_fourth_with_exit_77_naming_the_hang(
    tmp_path: Path,
) -> None:
    """Exit 76 asks for a restart; a hang that comes back at the same step every time is a crash loop
    all the same (Issue 40 item 2): it counts for the no-progress guard like an exception does. One rank,
    commits every 10 steps only: every attempt resumes from step 10 and hangs in step 16."""
    command = [JOB, "--root", tmp_path, "--devices", 1, "--hang-rank", 0, "--hang-step", HANG_STEP, "--floor", 1,
               "--grace", 0.5, "--long-phase", 2, "--hang-every-attempt", "--no-snapshots"]  # fmt: skip
    for number in (1, 2, 3):
        result = run_child(command, timeout=120)
        assert result.returncode == HANG_EXIT_CODE, f"attempt {number}:\n{result.stdout[-4000:]}"
    result = run_child(command, timeout=120)
    assert result.returncode == 77, result.stdout[-4000:]
    host = host_name()
    assert (
        "3 attempts in a row (1, 2, 3) resumed from step 10 (or started before it) and failed before committing a"
        f" checkpoint past it, each with Hang in step {HANG_STEP + 1}: rank 0 on {host} stopped in the training"
        " step (forward). Refusing to train attempt 4 from step 10" in result.stdout
    ), result.stdout[-4000:]
    events = _events(tmp_path)
    assert [e["attempt"] for e in events if e["event"] == "hang"] == [1, 2, 3]
    assert [e["step"] for e in events if e["event"] == "fit_start"] == [0, 10, 10, 10]
    assert [e["attempt"] for e in events if e["event"] == "no_progress_refused"] == [4]


# ---------------------------------------------------------------------- the rule, on numbers
def _history(*batches: float, val: tuple[float, ...] = (), window: int = 100) -> StepHistory:
    history = StepHistory(window)
    for seconds in batches:
        history.add_batch(seconds)
    for seconds in val:
        history.add_val_batch(seconds)
    return history


def test_the_in_step_timeout_is_the_floor_while_factor_times_the_longest_recent_batch_is_below_it() -> None:
    rule = HangRule(floor_s=2.0, factor=10.0, long_phase_s=20.0)
    timeout, why = rule.timeout(Phase.FORWARD, _history(0.05, 0.12, 0.08))
    assert timeout == 2.0
    assert why == "the floor, above 10 x the longest of the last 3 batches (0.12 s)"
    assert rule.step_timeout(_history(0.05, 0.12)) == 2.0


def test_the_in_step_timeout_is_learned_from_the_longest_recent_batch_once_it_passes_the_floor() -> None:
    rule = HangRule(floor_s=2.0, factor=10.0, long_phase_s=20.0)
    history = _history(0.1, 0.5, 0.3)
    for phase in (Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER, Phase.BETWEEN_STEPS):
        timeout, why = rule.timeout(phase, history)
        assert timeout == pytest.approx(5.0)
        assert why == "10 x the longest of the last 3 batches (0.5 s)"
    assert rule.step_timeout(history) == pytest.approx(5.0)
    assert HangRule(floor_s=2.0, factor=3.0).timeout(Phase.FORWARD, history)[0] == 2.0  # 1.5 s: the floor again


def test_only_the_last_window_of_batches_counts_so_an_old_slow_batch_stops_raising_the_timeout() -> None:
    rule = HangRule(floor_s=1.0, factor=10.0, long_phase_s=20.0, window=3)
    history = _history(0.9, 0.05, 0.05, window=3)
    assert rule.timeout(Phase.FORWARD, history)[0] == pytest.approx(9.0)
    history.add_batch(0.05)  # the 0.9 s batch leaves the window
    assert rule.timeout(Phase.FORWARD, history) == (1.0, "the floor, above 10 x the longest of the last 3 batches"
                                                         " (0.05 s)")  # fmt: skip


def test_before_any_batch_is_timed_a_step_gets_the_long_phase_allowance_and_no_in_step_timeout() -> None:
    rule = HangRule(floor_s=2.0, factor=10.0, long_phase_s=20.0)
    assert rule.timeout(Phase.FORWARD, StepHistory()) == (
        20.0,
        "the allowance for a first training batch (long_phase_s)",
    )
    assert rule.step_timeout(StepHistory()) is None
    # A floor above the allowance wins.
    assert HangRule(floor_s=30.0, long_phase_s=20.0).timeout(Phase.FORWARD, StepHistory()) == (
        30.0, "the floor, above the allowance for a first training batch",
    )  # fmt: skip


@pytest.mark.parametrize("phase", [Phase.STARTING, Phase.SAVING, Phase.EPOCH_EDGE, Phase.VALIDATION_EDGE,
                                   Phase.FINISHING])  # fmt: skip
def test_long_phases_get_their_allowance_not_the_in_step_timeout_and_learn_from_the_longest_seen(phase: Phase) -> None:
    rule = HangRule(floor_s=2.0, factor=10.0, long_phase_s=20.0)
    history = _history(0.05, 0.1)  # in-step: the floor, 2 s
    assert rule.timeout(phase, history) == (20.0, f"the allowance for {phase.label} (long_phase_s)")
    history.add_long_phase(phase, 1.5)  # 15 s learned: under the allowance, which stays
    assert rule.timeout(phase, history)[0] == 20.0
    history.add_long_phase(phase, 3.0)  # a phase seen taking 3 s may take 30
    assert rule.timeout(phase, history) == (30.0, "10 x the longest such phase seen (3 s)")
    history.add_long_phase(phase, 1.0)  # a shorter one does not lower it
    assert rule.timeout(phase, history)[0] == 30.0
    # Another long phase does not learn from this one.
    other = next(p for p in (Phase.SAVING, Phase.STARTING) if p is not phase)
    assert rule.timeout(other, history)[0] == 20.0


def test_validation_learns_from_validation_and_training_batches_after_its_first_batch() -> None:
    rule = HangRule(floor_s=2.0, factor=10.0, long_phase_s=20.0)
    assert rule.timeout(Phase.VALIDATING, _history(0.1)) == (20.0, "the allowance for a first validation batch"
                                                                   " (long_phase_s)")  # fmt: skip
    assert rule.timeout(Phase.VALIDATING, _history(0.1, val=(0.4,)))[0] == pytest.approx(4.0)
    assert rule.timeout(Phase.VALIDATING, _history(0.6, val=(0.4,)))[0] == pytest.approx(6.0)
    assert rule.timeout(Phase.VALIDATING, _history(0.05, val=(0.04,)))[0] == 2.0


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "5"])
def test_settings_that_are_not_positive_finite_seconds_are_refused(bad: object) -> None:
    for name in ("floor_s", "factor", "long_phase_s"):
        with pytest.raises(ValueError, match=f"hang watchdog: {name} must be a positive number"):
            HangRule(**{"floor_s": 1.0, name: bad})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="hang watchdog: grace_s must be a positive number"):
        HangWatchdog(floor_s=1.0, grace_s=bad)  # type: ignore[arg-type]


def test_a_factor_below_one_is_refused_and_no_floor_means_no_watchdog() -> None:
    with pytest.raises(ValueError, match="factor must be at least 1"):
        HangRule(floor_s=1.0, factor=0.5)
    assert HangWatchdog.optional(None, 10.0, 900.0, 30.0) is None
    assert isinstance(HangWatchdog.optional(120.0, 10.0, 900.0, 30.0), HangWatchdog)


# ---------------------------------------------------------------------- the verdict, on heartbeats
def _view(rank: int, marks: int, phase: Phase = Phase.BACKWARD, frozen: bool = False) -> RankView:
    return RankView(rank, f"node-{rank // 2}", 15, marks, phase.name, 3.0, frozen)


def test_the_rank_with_fewest_marks_is_the_one_the_others_wait_for() -> None:
    verdict = judge([_view(0, 62), _view(1, 61, Phase.FORWARD), _view(2, 62), _view(3, 62)], world_size=4)
    assert [v.rank for v in verdict.culprits] == [1]
    assert verdict.named == "rank 1 on node-0 (step 15, in the training step (forward), no progress for 3 s)"


def test_every_rank_at_the_same_mark_names_no_culprit_and_says_so() -> None:
    verdict = judge([_view(0, 62), _view(1, 62)], world_size=2)
    assert verdict.culprits == [] and verdict.missing == []
    assert verdict.named == "no rank is behind: every rank stopped at the same point (step 15, in backward, no" \
                            " progress for 3 s)"  # fmt: skip


def test_a_rank_in_a_save_is_ahead_of_one_with_as_many_marks_outside_it() -> None:
    verdict = judge([_view(0, 62, Phase.SAVING), _view(1, 62, Phase.BETWEEN_STEPS)], world_size=2)
    assert [v.rank for v in verdict.culprits] == [1]


def test_frozen_and_missing_ranks_are_named_too() -> None:
    verdict = judge([_view(0, 62), _view(1, 62, frozen=True)], world_size=3)
    assert [v.rank for v in verdict.culprits] == [1] and verdict.missing == [2]
    assert verdict.named == ("rank 1 on node-0 (step 15, in backward, no progress for 3 s) - its heartbeat stopped"
                             " being published; rank 2 (no heartbeat of this job found)")  # fmt: skip


# ---------------------------------------------------------------------- the grace, with the threads alone
class _Rank:
    """One rank's training thread, faked: a progress tuple the test moves (or not)."""

    def __init__(self) -> None:
        self.progress: Progress = (10, 5, Phase.FORWARD, time.monotonic())
        self.ended: list[tuple[int, float]] = []
        self.done = threading.Event()

    def advance(self) -> None:
        marks, step, _, _ = self.progress
        self.progress = (marks + 1, step + 1, Phase.BETWEEN_STEPS, time.monotonic())


def _monitor(tmp_path: Path, rank: _Rank, grace_s: float, events: EventLog | None = None) -> HangMonitor:
    history = _history(0.01)
    job = Job(tmp_path, 0, 1, ["node-0"], "token")

    def end(status: int) -> None:  # in production os._exit: here the watcher stops
        rank.ended.append((status, time.monotonic()))
        monitor.stop()
        rank.done.set()

    monitor = HangMonitor(HangRule(floor_s=0.3, long_phase_s=0.3), history, lambda: rank.progress, job,
                          grace_s=grace_s, end=end, events=lambda: events, resume_point=lambda: "step 0",
                          exit_status=HANG_EXIT_CODE)  # fmt: skip
    return monitor


def test_a_stall_past_the_timeout_ends_the_rank_with_76_after_the_grace_not_before(tmp_path: Path) -> None:
    rank = _Rank()
    events = EventLog(tmp_path)
    monitor = _monitor(tmp_path, rank, grace_s=1.0, events=events)
    stalled = rank.progress[3]
    monitor.start()
    try:
        assert rank.done.wait(10), "the watchdog never ended the rank"
    finally:
        monitor.stop()
    ((status, at),) = rank.ended
    assert status == 76
    time.sleep(0.2)  # the deadline armed at the hang is disarmed: it would end the rank a second time
    assert not [t for t in threading.enumerate() if getattr(t, "function", None) == monitor._end_now and t.is_alive()]
    assert at - stalled >= 0.3 + 1.0  # the timeout, then the whole grace
    (report,) = monitor.reports
    assert report["culprits"] == [] and report["exit_status"] == 76 and report["grace_s"] == 1.0
    assert [e["event"] for e in _events(tmp_path) if e["event"].startswith("hang")] == ["hang"]


def test_progress_within_the_grace_stands_the_watchdog_down_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    rank = _Rank()
    monitor = _monitor(tmp_path, rank, grace_s=1.0)
    monitor.start()
    try:
        deadline = time.monotonic() + 10
        while not monitor.reports and time.monotonic() < deadline:
            time.sleep(0.05)
        assert monitor.reports, "the watchdog never fired"
        with caplog.at_level(logging.WARNING, logger="lightning_field.profiling.watchdog"):
            for _ in range(15):  # the stalled step finished after all, and training goes on (past the grace)
                rank.advance()
                time.sleep(0.1)
    finally:
        monitor.stop()
    assert rank.ended == [] and len(monitor.reports) == 1
    assert any(r.message.startswith("HANG RESOLVED: rank 0 made progress again") for r in caplog.records)
