"""What ``trainmedic run`` costs a Keras job, as the job itself measures it.

``benchmarks/keras_job.py MODEL`` runs plain and under ``trainmedic run --quiet
--no-html`` in separate processes, alternating (plain first in even rounds,
supervised first in odd ones), ``--rounds`` times each; each run prints its own
train steps a second (step 50 to the end, on its own clock). The table gives
the median steps/s of each mode, the median of the per-round ratios
(supervised / plain) with their lowest..highest, per model.

    python benchmarks/keras_overhead.py [--models small,pipeline] [--rounds 5] [--steps 1500]
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB = HERE / "keras_job.py"


def one(model: str, steps: int, supervised: bool, tmp: Path) -> float:
    job = [sys.executable, str(JOB), model, "--steps", str(steps)]
    argv = job
    if supervised:
        out = Path(tempfile.mkdtemp(dir=tmp))
        argv = [sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html",
                "--out", str(out / "run"), "--", *job]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    m = re.search(r"steps_per_s ([\d.]+)", done.stdout)
    if done.returncode != 0 or m is None:
        raise SystemExit(f"{shlex.join(argv)} failed: {done.stderr[-2000:]}")
    return float(m[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", default="small,pipeline")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1500)
    args = parser.parse_args()
    started = time.monotonic()
    load0 = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            plain: list[float] = []
            under: list[float] = []
            for r in range(args.rounds):
                order = (False, True) if r % 2 == 0 else (True, False)
                got = {s: one(model, args.steps, s, Path(tmp)) for s in order}
                plain.append(got[False])
                under.append(got[True])
                print(f"{model} round {r + 1}: plain {got[False]:.1f}, "
                      f"trainmedic {got[True]:.1f} steps/s", flush=True)  # fmt: skip
            ratios = [u / p for u, p in zip(under, plain, strict=True)]
            rows.append(
                f"| {model} | {statistics.median(plain):.1f} | {statistics.median(under):.1f} | "
                f"{statistics.median(ratios):.3f} ({min(ratios):.3f}..{max(ratios):.3f}) |"
            )
    print()
    print(f"command: python benchmarks/keras_overhead.py --models {args.models} "
          f"--rounds {args.rounds} --steps {args.steps}")  # fmt: skip
    print(f"machine: {os.cpu_count()} CPUs; Python {platform.python_version()}, tensorflow "
          f"{version('tensorflow-cpu')}, keras {version('keras')}; load average "
          f"{load0[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; "
          f"{time.monotonic() - started:.0f} s")  # fmt: skip
    print()
    print("| job | plain steps/s (median) | under trainmedic run | steps/s ratio, per round: "
          "median (lowest..highest) |")
    print("|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
