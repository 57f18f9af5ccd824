"""Time per ``assert_resumes_exactly`` on the tiny examples, on this machine (issue 17: < 10 s each).

Runs the checks of ``examples/resume_in_ci/test_resume_exactly.py`` directly (not through pytest),
in one process, in the order below, ``--repeats`` times, and prints each check's wall time. The
first check of the process also starts the fork server (one import of torch and Lightning), so it is
printed apart; the rest reuse it, as the checks of one test session do.

Usage::

    python benchmarks/resume_assertion_time.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

EXAMPLE_DIR = Path(__file__).resolve().parent.parent / "examples" / "resume_in_ci"

CHECKS: list[tuple[str, dict]] = [
    ("mid-epoch, 8 steps", {}),
    ("mid-epoch + epoch-end, 12 steps", {"steps": 12, "kill_at": ["mid-epoch", "epoch-end"]}),
    ("2 loader workers (Python randomness)", {"data_kwargs": {"num_workers": 2}}),
    ("2-rank DDP (gloo)", {"devices": 2}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(EXAMPLE_DIR))
    import test_resume_exactly as example

    from lightning_field.testing import assert_resumes_exactly

    print(f"resume assertion time  {time.strftime('%Y-%m-%d %H:%M')}  cpus {os.cpu_count()}"
          f"  load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name, _ in CHECKS}
    with tempfile.TemporaryDirectory(prefix="resume-bench-") as root:
        for repeat in range(args.repeats + 1):
            for index, (name, options) in enumerate(CHECKS):
                start = time.perf_counter()
                evidence = assert_resumes_exactly(example.Regressor, example.RegressionData,
                                                  bundle_dir=Path(root) / f"round-{repeat}-check-{index}",
                                                  **options)  # fmt: skip
                seconds = time.perf_counter() - start
                assert evidence.verdict == "exact", evidence.verdict
                if repeat == 0 and name == CHECKS[0][0]:
                    print(f"  first check of the process (starts the fork server): {seconds:.2f} s")
                if repeat:
                    times[name].append(seconds)
    for name, seconds in times.items():
        print(f"  {name:<40} median {statistics.median(seconds):5.2f} s  rounds {[round(s, 2) for s in seconds]}")
    print(f"  load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
