"""The no-progress guard: a run that fails at the same point every attempt stops being restarted.

A module that raises in step 23 every time, under ``torchrun --max-restarts=N`` (or a requeue loop),
makes N + 1 attempts that each resume from the same checkpoint and fail before the next one: the
restarts redo the same steps and never get further. Every attempt that ends with an exception records
it in the event log (``attempt_failed``: the step it reached, the step that failed, the exception's
type and a shortened message, the code identity); an attempt the hang watchdog ended (exit 76, from a
thread: nothing was raised) counts by its ``hang`` event, with the code identity its ``fit_start``
recorded. At the start of training, before the first batch, the next attempt counts the attempts before
it that failed with nothing committed past the step it resumed from; at ``max_failed_attempts``
(default 3) of them it refuses to train: :class:`NoProgressError`, exit status
:data:`NO_PROGRESS_EXIT_CODE` (77) uncaught, which a launcher or batch script can treat as final
(docs/no-progress.md).

The count starts over where progress was made (a commit past that step, a finished attempt), where
the code changed (its git commit or diff, the Python/torch/Lightning versions: presumably the fix),
and for one attempt with ``LIGHTNING_FIELD_RETRY_NO_PROGRESS=1`` (the cause was outside the code: a
data file, a full disk). Attempts killed without a trace (SIGKILL, the OOM killer), preempted or
refused neither count nor start it over.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import lightning.pytorch as pl

from lightning_field.checkpoint.options import positive_or_none
from lightning_field.checkpoint.owner import EventSource
from lightning_field.checkpoint.preemption import TrainingPreempted
from lightning_field.core.events import EventLog, read_events
from lightning_field.core.hashing import IDENTITY_ALGORITHM, new_hasher
from lightning_field.core.heartbeat import Phase

__all__ = [
    "NO_PROGRESS_EXIT_CODE",
    "RETRY_ENV",
    "FailedAttempt",
    "NoProgressError",
    "NoProgressGuard",
    "failed_attempts_without_progress",
]

log = logging.getLogger(__name__)

#: sysexits.h's EX_NOPERM: what an attempt refused by the guard exits with when nothing catches
#: :class:`NoProgressError`; distinct from 75 (preempted, retry) and 76 (a hang, restart): final.
NO_PROGRESS_EXIT_CODE = 77
RETRY_ENV = "LIGHTNING_FIELD_RETRY_NO_PROGRESS"
"""Set to 1 for one more attempt despite the count (each further failure refuses again)."""
MESSAGE_CHARS = 200
COMMITS = ("ckpt_committed", "snapshot_committed")
REFUSED_STATUS = "refused: no progress"
NOT_FAILURES = ("KeyboardInterrupt",)
"""Exceptions recorded but not counted: a person stopped the attempt (Ctrl-C), the code did not fail."""
HANG_EXCEPTION = "Hang"
"""What a hang (``hang`` event, exit 76) counts as: the watchdog ended the attempt, nothing raised."""


@dataclass(frozen=True)
class FailedAttempt:
    """One attempt that ended with an exception and left the resume point where it was."""

    attempt: int
    step: int | None  # the step it reached: it failed in the next one
    exception: str
    message: str
    retried: bool = False  # it was the one more attempt RETRY_ENV allowed

    def describe(self) -> str:
        where = f" in step {self.step + 1}" if self.step is not None else ""
        return f"{self.exception}{where}" + (f": {self.message}" if self.message else "")


class NoProgressError(SystemExit):
    """The attempts before this one resumed from ``step`` and failed before committing anything past
    it, ``len(attempts)`` times: this one refuses to train (before its first batch).

    A ``SystemExit`` (as :class:`~lightning_field.checkpoint.preemption.TrainingPreempted` is), so an
    ``except Exception`` around ``fit`` does not swallow it and, uncaught, the process exits with
    :data:`NO_PROGRESS_EXIT_CODE` (77) without a traceback; the reason is logged first.

    Attributes:
        step: the step every counted attempt resumed from (or started before) and could not pass.
        attempts: the counted attempts, oldest first: their numbers, steps and exceptions.
    """

    def __init__(self, step: int, attempts: list[FailedAttempt], attempt: int | None = None) -> None:
        super().__init__(NO_PROGRESS_EXIT_CODE)
        self.step = step
        self.attempts = list(attempts)
        self.attempt = attempt

    def __str__(self) -> str:
        return refusal_message(self.step, self.attempts, self.attempt)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.step, self.attempts, self.attempt))


def shorten(text: str, limit: int = MESSAGE_CHARS) -> str:
    """One line of at most ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def code_digest(code: Mapping[str, Any]) -> str:
    """A short hash of a run's code identity (``provenance.code``: versions, git commit, diff hash)."""
    hasher = new_hasher(IDENTITY_ALGORITHM)
    hasher.update(json.dumps(dict(code), sort_keys=True, default=str).encode())
    return str(hasher.hexdigest())[:16]


def failed_attempts_without_progress(
    events: Iterable[Mapping[str, Any]], step: int, code: str | None, current: int
) -> list[FailedAttempt]:
    """The attempts before ``current`` that failed with nothing committed past ``step``, counted back
    from the newest until one that made progress (committed past ``step``, finished, or started past
    it) or ran other code; oldest first. Pure: a function of the event log.

    An attempt's resume point at its end is the newest step it committed, else the step it started
    from; one that trained (``fit_start``), left it at ``step`` and failed counts. One without an
    exception record (killed, preempted, refused), stopped by Ctrl-C or that never trained is passed over."""
    grouped: dict[int, list[Mapping[str, Any]]] = {}
    for event in events:
        grouped.setdefault(int(event.get("attempt", 1)), []).append(event)
    counted: list[FailedAttempt] = []
    for number in sorted((n for n in grouped if n < current), reverse=True):
        own = grouped[number]
        statuses = [str(e["payload"].get("status", "")) for e in own if e["event"] == "attempt_end"]
        if "finished" in statuses:
            break
        started = [int(e["step"]) for e in own if e["event"] == "fit_start" and e.get("step") is not None][:1]
        if not started:
            continue  # it never trained (died in start-up, a refused resume): nothing said either way
        points = started + [int(e["step"]) for e in own if e["event"] in COMMITS and e.get("step") is not None]
        if max(points) != step:
            break  # it moved the resume point (or started elsewhere): what came before it is another story
        retried = any(e["event"] == "no_progress_retry" for e in own)
        failures = [e for e in own if e["event"] == "attempt_failed"]
        # A hang the watchdog stood down from (the rank moved again) ended nothing.
        last_hang = next((e for e in reversed(own) if e["event"] in ("hang", "hang_resolved")), None)
        hang = last_hang if last_hang is not None and last_hang["event"] == "hang" else None
        if failures:
            payload = failures[-1]["payload"]
            if payload.get("exception") in NOT_FAILURES:
                continue
            if code is not None and payload.get("code") not in (None, code):
                break  # other code failed: the fix is presumably this one
            counted.append(
                FailedAttempt(
                    number,
                    payload.get("step"),
                    str(payload.get("exception", "?")),
                    str(payload.get("message", "")),
                    retried,
                )
            )
        elif hang is not None:
            # Ended by the hang watchdog from a thread (exit 76): no exception was raised to record.
            ran = next(e for e in own if e["event"] == "fit_start").get("payload") or {}
            if code is not None and ran.get("code") not in (None, code):
                break
            counted.append(
                FailedAttempt(number, hang.get("step"), HANG_EXCEPTION, hang_summary(hang["payload"]), retried)
            )
        elif any(s.startswith("failed") and s.partition(": ")[2] not in NOT_FAILURES for s in statuses):
            # a log written before attempt_failed
            counted.append(FailedAttempt(number, None, statuses[-1].partition(": ")[2] or "an exception", ""))
    return counted[::-1]


def hang_summary(report: Mapping[str, Any]) -> str:
    """One line for a ``hang`` event's report: the rank(s) the job waited for and where they stopped
    (every rank, where none was behind the others: a job of one rank, or all stuck alike). No
    durations: the same hang, attempt after attempt, reads the same."""
    named = [report.get(key) for key in ("culprits", "ranks")]  # read from a log others can write
    stalled = [r for r in next((v for v in named if isinstance(v, list) and v), []) if isinstance(r, Mapping)]
    where = []
    for rank in stalled:
        phase = str(rank.get("phase"))
        label = Phase[phase].label if phase in Phase.__members__ else phase
        where.append(f"rank {rank.get('rank')} on {rank.get('host')} stopped in {label}")
    return shorten("; ".join(where) or "no rank named")


def refusal_message(step: int, attempts: list[FailedAttempt], attempt: int | None) -> str:
    """What the refused attempt says: the step, the exceptions, the attempts and the way out."""
    numbers = ", ".join(str(a.attempt) for a in attempts)
    kinds: dict[str, list[int]] = {}
    for a in attempts:
        kinds.setdefault(a.describe(), []).append(a.attempt)
    if len(kinds) == 1:
        failures = f"each with {next(iter(kinds))}"
    else:
        failures = "; ".join(f"attempt {', '.join(map(str, n))}: {d}" for d, n in kinds.items())
    this = f"attempt {attempt}" if attempt is not None else "this attempt"
    return (
        f"lightning_field: no progress: {len(attempts)} attempts in a row ({numbers}) resumed from step {step}"
        f" (or started before it) and failed before committing a checkpoint past it, {failures}. Refusing"
        f" to train {this} from step {step}: it would fail the same way (exit status {NO_PROGRESS_EXIT_CODE},"
        f" NO_PROGRESS_EXIT_CODE, final). Fix the cause, then rerun: changed code starts the count over;"
        f" {RETRY_ENV}=1 allows one more attempt of the same code; ResumeConfig(max_failed_attempts=None)"
        " turns this guard off."
    )


class NoProgressGuard:
    """ManifestCheckpoint's no-progress guard: :meth:`fit_start` at ``on_train_start`` (after the
    resume's load: ``global_step`` is the step resumed from), :meth:`ended` from ``on_exception``.

    Args:
        checkpoint: the callback whose event log (``events``, global rank 0) is read and written.
        max_failed_attempts: failed attempts without progress before the next refuses; None: off.
        code: this run's code identity (``provenance.code``), read after setup.

    Raises:
        ValueError: ``max_failed_attempts`` is neither None nor an integer >= 1.
    """

    def __init__(
        self, checkpoint: EventSource, max_failed_attempts: int | None, code: Callable[[], Mapping[str, Any]]
    ) -> None:
        self.max_failed_attempts = positive_or_none("resume.max_failed_attempts", max_failed_attempts)
        self._checkpoint = checkpoint
        self._code = code

    def fit_start(self, trainer: pl.Trainer) -> None:
        """Record ``fit_start`` at the step resumed from; refuse to train, on every rank alike, where
        the attempts before failed there ``max_failed_attempts`` times.

        Raises:
            NoProgressError: on every rank, before the first batch.
        """
        events = self._checkpoint.events
        step = trainer.global_step
        digest = code_digest(self._code()) if events is not None else None
        if events is not None:
            # The code it runs, for an attempt that ends with no exception to record it (a hang).
            events.emit("fit_start", step=step, payload={"code": digest})
        if self.max_failed_attempts is None:
            return
        refused: list[FailedAttempt] | None = None
        failure: Exception | None = None
        if events is not None:  # global rank 0, the one that holds the log
            try:
                refused = self._refusal(trainer, events, step, digest)
            except Exception as err:  # a log others can write: every rank must hear it, none wait for rank 0
                failure = err
        # Every rank calls it: all refuse, or none; and all fail where rank 0's guard failed.
        shown = None if failure is None else f"{type(failure).__name__}: {failure}"
        refused, shown = trainer.strategy.broadcast((refused, shown), src=0)
        if failure is not None:
            raise failure
        if shown is not None:
            raise RuntimeError(f"lightning_field: the no-progress guard failed on global rank 0: {shown}")
        if refused:
            error = NoProgressError(step, refused, events.attempt if events is not None else None)
            if trainer.is_global_zero:
                log.error("%s", error)
            raise error

    def _refusal(
        self, trainer: pl.Trainer, events: EventLog, step: int, digest: str | None
    ) -> list[FailedAttempt] | None:
        """Rank 0: the attempts that make this one refuse, recorded as such; None to train."""
        assert self.max_failed_attempts is not None
        # The whole log, not one run: a crash loop that fails before its first commit starts a new run
        # each time outside a scheduler's restarts, and is still the same code failing at the same step.
        failed = failed_attempts_without_progress(read_events(events.run_dir), step, digest, events.attempt)
        if len(failed) < self.max_failed_attempts:
            return None
        # One more attempt per count: the variable left set in a job script allows no second.
        if os.environ.get(RETRY_ENV, "").strip() not in ("", "0") and not any(a.retried for a in failed):
            log.warning(
                "lightning_field: %s=1: one more attempt from step %d despite %d failed attempts without progress",
                RETRY_ENV,
                step,
                len(failed),
            )
            events.emit("no_progress_retry", step=step, payload={"attempts": [a.attempt for a in failed]})
            return None
        payload = {"attempts": [asdict(a) for a in failed], "limit": self.max_failed_attempts}
        events.emit("no_progress_refused", step=step, payload=payload)
        return failed

    def ended(self, trainer: pl.Trainer, exception: BaseException) -> str:
        """The attempt's end status for ``exception``; an exception from training (not a preemption, not
        this guard's refusal) is recorded as ``attempt_failed`` first."""
        if isinstance(exception, TrainingPreempted):
            return "preempted"
        if isinstance(exception, NoProgressError):
            return REFUSED_STATUS
        kind = type(exception).__name__
        events = self._checkpoint.events
        if events is not None:
            step = trainer.global_step
            payload = {
                "step": step,
                "failed_step": step + 1,
                "exception": kind,
                "message": shorten(str(exception)),
                "code": code_digest(self._code()),
            }
            events.emit("attempt_failed", step=step, payload=payload)
        return f"failed: {kind}"
