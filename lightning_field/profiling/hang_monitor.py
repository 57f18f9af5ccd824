"""The hang watchdog's threads, without Lightning: one watches this rank's progress, one publishes it.

The training thread only stores a tuple in memory at each mark
(:class:`~lightning_field.profiling.watchdog.HangWatchdog`). Two daemon threads do the rest:

* the **watcher** reads that tuple every poll and compares its age with the rule's timeout; it does no
  I/O until it fires, so a stuck filesystem (a common cause of hangs) cannot stop it from firing;
* the **publisher** writes this rank's heartbeat record (``field/heartbeat/rank-NNNNN.json``) every
  poll and, on ranks other than 0, reads rank 0's, to learn that rank 0 declared a hang.

When the watcher fires (its own rank stalled, or rank 0 declared a hang): it arms a deadline that ends
the process whatever happens next, dumps this process's stacks (faulthandler, every thread) to
``field/heartbeat/rank-NNNNN-stacks.txt``, reads every rank's heartbeat to find whom the job waits for
(:func:`~lightning_field.profiling.hang_rule.judge`), reports it (rank 0: the log, with the culprits'
stacks, and the ``hang`` event; a culprit: its own stacks on its own stderr), then waits out the grace
period: if this rank makes progress again, it stands down; otherwise it ends the process.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning_field.core.events import EventLog
from lightning_field.core.heartbeat import rank_heartbeat_path, rank_stacks_path, read_rank_record, write_rank_record
from lightning_field.core.workers import WATCHING, WRITING
from lightning_field.profiling.hang_rule import HangRule, Phase, RankView, StepHistory, Verdict, judge

log = logging.getLogger("lightning_field.profiling.watchdog")

STACKS_SHOWN = 20_000
"""How much of a rank's stacks goes into the log and the event (the file holds them all)."""
RANKS_LISTED = 64
"""How many ranks' heartbeats the ``hang`` event lists (the culprits are always named)."""

Progress = tuple[int, int, Phase, float]
"""(marks passed, global step, phase, monotonic time of the last mark): what the training thread stores."""


@dataclass(frozen=True)
class Job:
    """What every rank agreed on at setup (one all-gather) and where its heartbeats live."""

    run_dir: Path
    rank: int
    world_size: int
    hosts: list[str]
    token: str


class HangMonitor:
    """Watches one rank's progress; see the module docstring.

    Args:
        rule: the timeout rule.
        history: the rank's timed batches and phases (written by the training thread).
        progress: returns the training thread's latest :data:`Progress`.
        job: this rank and its job.
        grace_s: from firing to the end of the process: time for every rank to dump its stacks, for
            rank 0 to read the culprits', for a background commit in flight to finish, and for a stall
            that ends to be seen as one.
        end: ends the process with the given exit status (never returns in production).
        events: the run's event log on rank 0, else None.
        resume_point: a sentence naming what a restart resumes from.
        exit_status: what the process ends with.
    """

    def __init__(
        self,
        rule: HangRule,
        history: StepHistory,
        progress: Callable[[], Progress],
        job: Job,
        *,
        grace_s: float,
        end: Callable[[int], None],
        events: Callable[[], EventLog | None],
        resume_point: Callable[[], str],
        exit_status: int,
    ) -> None:
        self.rule, self.history, self.job, self.grace_s = rule, history, job, grace_s
        self.poll_s = min(max(rule.floor_s / 10, 0.1), 5.0)
        self.reports: list[dict[str, Any]] = []
        """One per hang this process saw: what rank 0 put in the event (on every rank, as it judged)."""
        self.closest: dict[str, tuple[float, float, float | None]] = {}
        """Per phase: the longest time without progress the watcher saw, the timeout then, and the
        in-step timeout then (what the phase would have had without its allowance)."""
        self._progress, self._end, self._events, self._resume_point = progress, end, events, resume_point
        self._exit_status = exit_status
        self._stop = threading.Event()
        self._declared = 0  # rank 0: hangs declared; others: the newest declaration of rank 0's seen
        self._answered = 0  # the newest declaration this rank dumped its stacks for
        self._dumps = 0
        self._published = 0
        self._loops: list[Future[None]] = []

    # ------------------------------------------------------------------ threads
    def start(self) -> None:
        """The watchdog and heartbeat loops, each on a parked thread that outlives the fit: a thread
        ending at teardown could hang a DataLoader forking for ``validate``/``test`` (core/workers.py)."""
        rank_heartbeat_path(self.job.run_dir, self.job.rank).parent.mkdir(parents=True, exist_ok=True)
        self._stop.clear()
        self._loops = [WATCHING.submit(self._watch), WATCHING.submit(self._publish_loop)]

    def stop(self) -> None:
        self._stop.set()
        if threading.current_thread().name != WATCHING.name:  # not from a loop: it would wait on itself
            futures_wait(self._loops, timeout=2 * self.poll_s + 1)
        self._loops = []

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            age, timeout, why, phase = self._age()
            seen = self.closest.get(phase.name)
            if seen is None or age > seen[0]:
                self.closest[phase.name] = (age, timeout, self.rule.step_timeout(self.history))
            if age > timeout:
                self._handle(age, timeout, why)
            elif self.job.rank != 0 and self._declared > self._answered:
                self._dump_stacks()  # rank 0 declared a hang this rank has not reached yet: its stacks still help

    def _age(self) -> tuple[float, float, str, Phase]:
        _, _, phase, beat = self._progress()
        timeout, why = self.rule.timeout(phase, self.history)
        return time.monotonic() - beat, timeout, why, phase

    def _publish_loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self._publish()
                if self.job.rank != 0:
                    zero = read_rank_record(rank_heartbeat_path(self.job.run_dir, 0))
                    if zero is not None and zero["token"] == self.job.token and zero["declared"] > self._declared:
                        self._declared = zero["declared"]
            except (OSError, ValueError) as err:  # the next poll tries again; the watcher needs none of this
                log.debug("hang watchdog: could not publish rank %d's heartbeat: %s", self.job.rank, err)

    def _publish(self) -> None:
        marks, step, phase, beat = self._progress()
        self._published += 1
        record = {
            "token": self.job.token,
            "rank": self.job.rank,
            "host": self.job.hosts[self.job.rank][:256],
            "pid": os.getpid(),
            "published": self._published,
            "marks": marks,
            "step": step,
            "phase": phase.name,
            "no_progress_s": round(time.monotonic() - beat, 3),
            "timeout_s": self.rule.timeout(phase, self.history)[0],
            "declared": self._declared,
            "stacks": self._dumps,
        }
        write_rank_record(rank_heartbeat_path(self.job.run_dir, self.job.rank), record)

    # ------------------------------------------------------------------ a hang
    def _handle(self, age: float, timeout: float, why: str) -> None:
        fired = time.monotonic()
        beat = self._progress()[3]
        own_deadline = fired + self.grace_s + (0.0 if self.job.rank == 0 else self._peer_margin)
        # Armed first: whatever below blocks (a stuck filesystem, a full pipe), the process still ends.
        deadline = threading.Timer(own_deadline - fired + 10.0, self._end_now)
        deadline.daemon = True
        deadline.start()
        try:
            if self.job.rank == 0:
                self._declared += 1
            stacks = self._dump_stacks()
            verdict = self._survey(fired)
            self._report(verdict, stacks, age, timeout, why)
            resumed = self._wait_out(own_deadline, beat)
        except Exception:  # the watchdog must end the process, not die with a traceback
            log.exception("hang watchdog: reporting the hang failed; ending the process anyway")
            resumed = False
        if resumed:
            deadline.cancel()
            self._stand_down(time.monotonic() - beat)
            return
        self._finish()
        deadline.cancel()  # reached only where `end` returns (a test's): else the deadline would end it twice

    @property
    def _peer_margin(self) -> float:
        # Ranks other than 0 outlive rank 0's end by this much: under Lightning's launcher rank 0 ends
        # them (its exit status is the job's); under torchrun its agent does. They end themselves after.
        return max(5.0, 4 * self.poll_s)

    def _dump_stacks(self) -> str:
        self._answered = self._declared
        path = rank_stacks_path(self.job.run_dir, self.job.rank)
        try:
            with open(path, "w") as f:
                f.write(
                    f"# rank {self.job.rank} on {self.job.hosts[self.job.rank]}, pid {os.getpid()}, "
                    f"{time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n"
                )
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
            text = path.read_text()
        except OSError as err:
            text = f"(stacks not written to {path}: {err})"
        self._dumps += 1
        try:
            self._publish()
        except (OSError, ValueError) as err:
            log.debug("hang watchdog: could not publish after the stack dump: %s", err)
        return text

    def _survey(self, fired: float) -> Verdict:
        """Every rank's heartbeat, read for a few polls (so that a frozen one shows), and on rank 0
        until every culprit has answered its declaration with its stacks (half the grace at most)."""
        first: dict[int, dict[str, Any]] = {}
        latest: dict[int, dict[str, Any]] = {}
        until = fired + (self.grace_s / 2 if self.job.rank == 0 else 3 * self.poll_s)
        polls = 0
        while True:
            for rank in range(self.job.world_size):
                record = read_rank_record(rank_heartbeat_path(self.job.run_dir, rank))
                if record is not None and record["token"] == self.job.token and record["rank"] == rank:
                    first.setdefault(rank, record)
                    latest[rank] = record
            polls += 1
            verdict = self._verdict(first, latest, polls)
            answered = self.job.rank != 0 or all(
                latest[v.rank]["declared"] >= self._declared for v in verdict.culprits if not v.frozen
            )
            if time.monotonic() >= until or (polls >= 4 and answered):
                return verdict
            if self.job.rank != 0 and self._declared > self._answered:
                self._dump_stacks()
            time.sleep(self.poll_s)

    def _verdict(self, first: dict[int, dict[str, Any]], latest: dict[int, dict[str, Any]], polls: int) -> Verdict:
        views = []
        for rank, record in latest.items():
            frozen = polls >= 4 and record["published"] == first[rank]["published"] and rank != self.job.rank
            views.append(
                RankView(
                    rank,
                    record["host"],
                    record["step"],
                    record["marks"],
                    record["phase"],
                    float(record["no_progress_s"]),
                    frozen,
                )
            )
        return judge(views, self.job.world_size)

    def _report(self, verdict: Verdict, own_stacks: str, age: float, timeout: float, why: str) -> None:
        job = self.job
        culprit_stacks = {
            v.rank: own_stacks if v.rank == job.rank else self._read_stacks(v.rank) for v in verdict.culprits
        }
        waiting_for = verdict.named
        for rank in verdict.missing:
            if job.hosts[rank] != job.hosts[job.rank]:
                waiting_for += f" [rank {rank} runs on {job.hosts[rank]}: is {job.run_dir} shared with it?]"
        save = (
            "none attempted: every rank that could take part in a save is blocked in a collective that"
            " waits for the stalled rank, and a watchdog thread would copy a state in mid-step, which cannot"
            " resume exactly; a background commit already in flight gets the grace period to finish"
        )
        resume = self._resume_point()
        report = {
            "detected_by": job.rank,
            "no_progress_s": round(age, 3),
            "timeout_s": round(timeout, 3),
            "rule": why,
            "culprits": [
                {
                    **v.to_dict(),
                    "stacks": culprit_stacks[v.rank][-STACKS_SHOWN:],
                    "stacks_file": str(rank_stacks_path(job.run_dir, v.rank)),
                }
                for v in verdict.culprits
            ],
            "missing": verdict.missing,
            "ranks": [v.to_dict() for v in verdict.views[:RANKS_LISTED]],
            "ranks_not_listed": max(len(verdict.views) - RANKS_LISTED, 0),
            "save": save,
            "resume_point": resume,
            "exit_status": self._exit_status,
            "grace_s": self.grace_s,
            "background_commit_in_flight": _writer_running(),
        }
        self.reports.append(report)
        if job.rank != 0:
            if any(v.rank == job.rank for v in verdict.culprits):
                own = next(v for v in verdict.culprits if v.rank == job.rank)
                log.error(
                    "HANG: this rank (%d on %s) is the one the job waits for: %s. Its stacks (%s):\n%s",
                    job.rank,
                    job.hosts[job.rank],
                    own.where(),
                    rank_stacks_path(job.run_dir, job.rank),
                    own_stacks[-STACKS_SHOWN:],
                )
            else:
                log.warning(
                    "HANG: rank %d on %s stalled; the job waits for %s; this rank's stacks: %s",
                    job.rank,
                    job.hosts[job.rank],
                    waiting_for,
                    rank_stacks_path(job.run_dir, job.rank),
                )
            return
        shown = "".join(
            f"\n  Stacks of rank {r} ({rank_stacks_path(job.run_dir, r)}):\n{text[-STACKS_SHOWN:]}"
            for r, text in culprit_stacks.items()
        )
        log.error(
            "HANG: no progress on rank 0 for %.2f s, over its timeout of %.2f s (%s).\n  The job waits for: %s\n"
            "  Save: %s.\n  Resume point: %s\n  Ending every rank in %.0f s with exit status %d (HANG_EXIT_CODE)"
            " so that the launcher restarts the job.%s",
            age,
            timeout,
            why,
            waiting_for,
            save,
            resume,
            self.grace_s,
            self._exit_status,
            shown,
        )
        events = self._events()
        if events is not None:
            step = self._progress()[1]
            events.emit("hang", step=step if step >= 0 else None, payload=report)

    def _read_stacks(self, rank: int) -> str:
        path = rank_stacks_path(self.job.run_dir, rank)
        try:
            return path.read_text(errors="replace")[: 4 * STACKS_SHOWN]
        except OSError:
            return f"(no stacks at {path}: that rank never wrote them, or its host does not share this directory)"

    def _wait_out(self, until: float, beat: float) -> bool:
        """Until ``until``: True as soon as this rank makes progress again; answers new declarations."""
        while time.monotonic() < until:
            if self._progress()[3] != beat:
                return True
            if self.job.rank != 0 and self._declared > self._answered:
                self._dump_stacks()
            time.sleep(min(self.poll_s, max(until - time.monotonic(), 0.0)))
        return self._progress()[3] != beat

    def _stand_down(self, stalled_s: float) -> None:
        log.warning(
            "HANG RESOLVED: rank %d made progress again after %.1f s without; the watchdog stands down"
            " and training goes on",
            self.job.rank,
            stalled_s,
        )
        events = self._events()
        if events is not None:
            events.emit(
                "hang_resolved",
                step=self._progress()[1],
                payload={"rank": self.job.rank, "stalled_s": round(stalled_s, 3)},
            )
        if self.job.rank == 0:
            self._publish_quietly()

    def _finish(self) -> None:
        waited_for_writer = _writer_running()
        log.error(
            "HANG: ending rank %d with exit status %d%s",
            self.job.rank,
            self._exit_status,
            " (a background checkpoint commit is still in flight: abandoned, uncommitted, never advertised)"
            if waited_for_writer
            else "",
        )
        self._end(self._exit_status)

    def _end_now(self) -> None:
        # The deadline: the reporting above is stuck (in I/O, most likely). No logging: its locks may be held.
        try:
            os.write(
                2,
                f"HANG: rank {self.job.rank}: the watchdog's report did not finish; ending with exit status"
                f" {self._exit_status}\n".encode(),
            )
        finally:
            self._end(self._exit_status)

    def _publish_quietly(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._publish()


def _writer_running() -> bool:
    return WRITING.busy
