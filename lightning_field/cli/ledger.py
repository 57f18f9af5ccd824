"""``field ledger RUN_DIR``: the goodput ledger of a run, from its event log: per attempt where it
resumed from, the step it reached, the steps the next attempt redid and the tier it was cut back to;
the run's time by bucket. ``--json`` prints the ledger as a document.

A run directory's log can hold several runs (scripts that share the working directory): the newest
is accounted, the others are named, and ``--run-id`` picks one."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from lightning_field.core.events import EventLogError, read_events, run_of_attempts, runs_in, select_run
from lightning_field.quality.ledger import AttemptAccount, Ledger, goodput_ledger

COLUMNS = ("attempt", "status", "resumed from", "reached", "redone", "cut back to", "productive s", "lost s")


def _resumed(account: AttemptAccount) -> str:
    if account.resumed_from_step is None:
        return "- (no checkpoint)"
    return f"{account.resumed_from_step} ({account.resumed_from_tier or 'persistent'})"


def _cut_back(account: AttemptAccount, is_last: bool) -> str:
    if account.cut_back_to is not None:
        return account.cut_back_to
    return "no later attempt" if is_last else "-"


def render(ledger: Ledger, run_dir: str, run_id: str | None = None) -> str:
    """The ledger as a table and a few lines of totals."""
    last = len(ledger.attempts) - 1
    rows = [
        (
            str(a.attempt),
            a.status,
            _resumed(a),
            "-" if a.last_step is None else str(a.last_step),
            str(a.lost_steps),
            _cut_back(a, index == last),
            f"{a.seconds.get('productive', 0.0):.2f}",
            f"{a.seconds.get('lost_progress', 0.0):.2f}",
        )
        for index, a in enumerate(ledger.attempts)
    ]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(COLUMNS)]
    line = "  ".join(f"{{:<{w}}}" for w in widths)
    by_tier = ", ".join(f"{tier} {n}" for tier, n in ledger.redone_steps.items() if n)
    out = [
        f"{run_dir}{f' run {run_id}' if run_id else ''}: {len(ledger.attempts)} attempt(s),"
        f" {ledger.interruptions} interruption(s),"
        f" {ledger.lost_steps} step(s) redone"
        + (f" ({by_tier})" if by_tier else "")
        + f"; goodput {ledger.goodput:.1%} of {ledger.elapsed_s:.1f} s",
        line.format(*COLUMNS).rstrip(),
        *(line.format(*r).rstrip() for r in rows),
        "time: " + ", ".join(f"{k} {v:.2f} s" for k, v in ledger.buckets.items()),
        "idle_other: " + ", ".join(f"{k} {v:.2f} s" for k, v in ledger.idle_breakdown.items()),
    ]
    return "\n".join(out)


def cmd_ledger(args: argparse.Namespace) -> int:
    run_dir = Path(args.run_dir)
    try:
        events = read_events(run_dir)
        run = select_run(events, args.run_id)
        ledger = goodput_ledger(run, now=time.time() if args.running else None)
    except (EventLogError, ValueError) as err:
        print(f"field ledger: {run_dir}: {err}", file=sys.stderr)
        return 1
    runs = runs_in(events)
    run_id = next(iter(set(run_of_attempts(run).values())), None)
    if args.json:
        print(json.dumps({**ledger.to_dict(), "run_id": run_id, "runs": runs}, indent=2, sort_keys=True))
        return 0
    print(render(ledger, str(run_dir), run_id))
    others = [f"{r} (attempts {', '.join(map(str, a))})" for r, a in runs.items() if r != run_id]
    if others:
        print(f"other runs in this log: {'; '.join(others)}. Pick one with --run-id.")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    ledger = sub.add_parser(
        "ledger",
        help="the goodput ledger of a run: per attempt its resume step, the step reached, the steps redone;"
        " time by bucket",
    )
    ledger.add_argument(
        "run_dir", help="the run directory, holding field/events.jsonl (default_root_dir; docs/layout.md)"
    )
    ledger.add_argument("--json", action="store_true", help="print the ledger as JSON")
    ledger.add_argument("--run-id", help="the run to account for, where the log holds several (default: the newest)")
    ledger.add_argument(
        "--running", action="store_true", help="the last attempt is still running: account for it up to now"
    )
    ledger.set_defaults(func=cmd_ledger)
