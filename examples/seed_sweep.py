"""Time-to-quality variance over seeds: one ``field-train -m`` sweep, then the spread of the results.

    python examples/seed_sweep.py [--seeds 0,1,2] [--root runs/seed_sweep] [--tiny] [field-train overrides ...]

A deadline claim built on one run's time to target ignores how much that time moves with nothing
but the seed. This runs the same job once per seed (a Hydra multirun: each job in its own named
directory, so a requeued sweep resumes every job where it stopped) and reports, per seed, the step
and wall time at which the target was first reached, then the mean, standard deviation and range.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from omegaconf import OmegaConf


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--root", default="runs/seed_sweep")
    parser.add_argument("--tiny", action="store_true", help="toy size: seconds per seed")
    parser.add_argument("overrides", nargs="*", help="further field-train overrides")
    args = parser.parse_args()
    root = Path(args.root).resolve()
    experiment = "char_gpt_tiny" if args.tiny else "char_gpt"
    command = [
        sys.executable, "-m", "lightning_field.cli.train_app", "-m", f"experiment={experiment}",
        "run_name=seed_sweep", f"paths.root_dir={root}", f"seed={args.seeds}", *args.overrides,
    ]  # fmt: skip
    if subprocess.run(command).returncode != 0:
        return 1

    sweep = root / "multirun" / "field-train" / "seed_sweep"
    rows = []
    for summary_path in sorted(sweep.glob("*/field/time_to_quality.json")):
        job = summary_path.parent.parent
        seed = OmegaConf.load(job / ".hydra" / "config.yaml").seed  # the job's composed config, as Hydra saved it
        rows.append((int(seed), json.loads(summary_path.read_text())))
    if not rows:
        print(f"no time_to_quality.json under {sweep}", file=sys.stderr)
        return 1

    target = rows[0][1]
    print(f"\nTime to quality over {len(rows)} seed(s): {target['monitor']} <= {target['target']}")
    reached = []
    for seed, summary in sorted(rows):
        hit = summary.get("reached")
        if hit:
            reached.append((hit["step"], hit["wall_s"]))
            print(f"  seed {seed}: step {hit['step']}, {hit['wall_s']:.1f} s, {hit['device_hours']:.4f} device-hours")
        else:
            print(f"  seed {seed}: not reached (latest {summary.get('latest', {}).get('value')})")
    if len(reached) >= 2:
        steps = [s for s, _ in reached]
        seconds = [w for _, w in reached]
        print(
            f"  steps to target: mean {statistics.mean(steps):.0f}, sd {statistics.stdev(steps):.0f},"
            f" range {min(steps)}-{max(steps)}"
        )
        print(
            f"  seconds to target: mean {statistics.mean(seconds):.1f}, sd {statistics.stdev(seconds):.1f},"
            f" range {min(seconds):.1f}-{max(seconds):.1f}"
        )
    print(f"  {len(reached)}/{len(rows)} seed(s) reached the target; jobs under {sweep}")
    return 0 if reached else 1


if __name__ == "__main__":
    sys.exit(main())
