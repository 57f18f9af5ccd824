"""The main job on embedded defaults: a character-level GPT trained to its target, through a real
interruption, with the evidence that its checkpoints restore exactly.

    python examples/main_job.py [--root runs/main_job] [--kill-at-step 300] [--tiny] [field-train overrides ...]

1. ``field-train`` trains the byte-level GPT on this Python's standard library source, with the whole
   bundle and restore drills on, and is SIGKILLed after ``--kill-at-step`` (a real kill, before that
   step's checkpoint: the work since the last commit is lost, as on a real failure).
2. The checkpoints are listed (``field ckpt list``): what a restart can resume from.
3. The *same command* runs again and resumes by itself from the newest recoverable checkpoint, reaches
   the target validation loss and prints time to quality and goodput over both attempts.
4. ``field-evidence`` restores a checkpoint of the same workload (toy size, so it takes a minute)
   and compares the continuation with two uninterrupted controls: the verdict and the gate.

Nothing is downloaded; no account or server is needed. Exit status 0 when the target was reached
and the evidence gate passed. ``--tiny`` runs everything at toy size (seconds; used by the tests).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf

from lightning_field.checkpoint.resolver import committed_checkpoints
from lightning_field.cli.main import main as field
from lightning_field.conf import CONFIG_DIR
from lightning_field.core.events import read_events


def tiny_workload() -> list[str]:
    """The evidence step's model and data as field-evidence overrides: experiment/char_gpt_tiny's
    values, read from the shipped config so the two cannot drift apart."""
    tiny = OmegaConf.load(CONFIG_DIR / "experiment" / "char_gpt_tiny.yaml")
    return [
        "model=char_gpt", "data=stdlib_text", f"model.max_steps={tiny.trainer.max_steps}",
        *(f"model.{key}={value}" for key, value in tiny.model.items()),
        *(f"data.{key}={value}" for key, value in tiny.data.items()),
    ]  # fmt: skip


def say(text: str) -> None:
    print(f"\n=== {text}", flush=True)


def run(command: list[str]) -> int:
    # Its own session: the kill drill SIGKILLs the job's process group, never this script.
    return subprocess.run(command, start_new_session=True).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="runs/main_job", help="where outputs/ and multirun/ go")
    parser.add_argument("--kill-at-step", type=int, default=None, help="default: 300 (--tiny: 25)")
    parser.add_argument("--tiny", action="store_true", help="toy size: the whole job in under a minute")
    parser.add_argument("overrides", nargs="*", help="further field-train overrides, e.g. trainer=ddp_cpu")
    args = parser.parse_args()
    root = Path(args.root).resolve()
    kill_at = args.kill_at_step or (25 if args.tiny else 300)
    experiment = "char_gpt_tiny" if args.tiny else "char_gpt"
    train = [
        sys.executable, "-m", "lightning_field.cli.train_app", f"experiment={experiment}", "run_name=main_job",
        f"paths.root_dir={root}", f"callbacks.restore_drill.every_n_checkpoints={1 if args.tiny else 2}",
        *args.overrides,
    ]  # fmt: skip
    run_dir = root / "outputs" / "field-train" / "main_job"

    say(f"1/4 train, SIGKILLed after step {kill_at}")
    killed = run([*train, f"fault.kill_at_step={kill_at}"])
    if killed != -9:
        print(f"expected the drill to SIGKILL the job, it exited with {killed}", file=sys.stderr)
        return 1
    fault = json.loads((run_dir / "field" / "fault.json").read_text())
    print(f"killed by SIGKILL after step {fault['step']} (pid {fault['pid']})")

    say("2/4 the checkpoints a restart can use")
    field(["ckpt", "list", str(run_dir / "checkpoints")])

    say("3/4 the same command again: it resumes by itself and trains to the target")
    if run(train) != 0:
        return 1
    summary = json.loads((run_dir / "field" / "time_to_quality.json").read_text())

    say("4/4 evidence: restore a checkpoint, compare the continuation with uninterrupted controls")
    entries = [e.manifest for e in committed_checkpoints(run_dir / "checkpoints") if e.manifest is not None]
    drilled = [m for m in entries if m.restore_drill]
    outcomes = ", ".join(f"step {m.step}: {m.restore_drill.get('outcome')}" for m in drilled) or "none ran"
    print(f"restore drills during training: {outcomes}")
    bundle = run_dir / "field" / "evidence" / "char_gpt_tiny"
    evidence = [
        sys.executable, "-m", "lightning_field.cli.evidence_app", *tiny_workload(), "evidence.steps=30",
        "evidence.interruptions=1", "evidence.kill_mode=mixed", "evidence.parallel_controls=true",
        "callbacks.checkpoint.every_n_train_steps=5", f"evidence.bundle_dir={bundle}",
        f"hydra.run.dir={run_dir / 'field' / 'evidence'}",
    ]  # fmt: skip
    if bundle.exists():
        print(f"{bundle} exists already (a rerun of this job): its verdict stands")
        gate = field(["evidence", "check", str(bundle)])
    else:
        gate = run(evidence)

    say("summary")
    reached = summary.get("reached")
    if reached:
        print(f"target {summary['monitor']} <= {summary['target']} reached at step {reached['step']} after"
              f" {reached['wall_s']:.0f} s (both attempts, the kill and the restart included)")  # fmt: skip
    else:
        print(f"target {summary['monitor']} <= {summary['target']} NOT reached")
    gp = summary["goodput"]
    print(f"goodput {100 * gp['goodput']:.1f}%, {gp['interruptions']} interruption(s), {gp['lost_steps']} step(s) lost")
    # The lost steps are bounded by the step-snapshot interval in force at the kill: say which and why.
    chosen = [e for e in read_events(run_dir) if e["event"] == "snapshot_interval" and e["attempt"] == 1]
    if chosen:
        interval = chosen[-1]["payload"]
        every = interval["every_n_train_steps"]
        when = "off" if every is None else f"every {every} step(s)"
        print(f"step snapshots at the kill: {when} ({interval['chosen_by']}): {interval['reason']}")
    print(f"evidence gate: {'passed' if gate == 0 else 'FAILED'} ({bundle / 'evidence.md'})")
    print(f"run directory: {run_dir}")
    return 0 if reached and gate == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
