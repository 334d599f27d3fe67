"""Run-to-run noise of an unchanged job, and what `trainmedic compare` says of its reruns.

Runs one command N times under `trainmedic run` (one after another, as a user reruns a
job), then:

* the run-to-run noise: the standard deviation of the log of each run's throughput
  (what `trainmedic.report.compare.RUN_NOISE` is set from), and of its within-run
  part (the block bootstrap's own spread), so the two can be told apart;
* the verdict of `compare` on every pair of runs (N*(N-1)/2 pairs): an unchanged job
  must never be `faster` or `slower`.

    python benchmarks/compare_reruns.py --runs 8
    python benchmarks/compare_reruns.py --runs 8 -- python train.py --steps 60

Prints a markdown table (docs/compare.md keeps one, with the command).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JOB = [sys.executable, str(ROOT / "tests" / "e2e" / "scripts" / "augment_no_workers.py"),
               "--steps", "60"]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("job", nargs="*", help="the command (default: a 60-step input-bound job)")
    args = parser.parse_args()
    job = args.job or DEFAULT_JOB
    sys.path.insert(0, str(ROOT / "src"))
    from trainmedic.record.store import load_run_record
    from trainmedic.report.compare import RUN_NOISE, compare_runs
    from trainmedic.report.run_findings import load_or_diagnose

    started = time.time()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        dirs = []
        for i in range(args.runs):
            d = Path(tmp) / f"run-{i + 1}"
            subprocess.run([sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html",
                            "--out", str(d), "--", *job],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True,
                           env=dict(os.environ, OMP_NUM_THREADS="1"))  # fmt: skip
            dirs.append(d)
        records = [load_run_record(d) for d in dirs]
        docs = [load_or_diagnose(d, r) for d, r in zip(dirs, records, strict=True)]
        rates = []
        verdicts: Counter[str] = Counter()
        widths = []
        for (i, a), (j, b) in itertools.combinations(enumerate(records), 2):
            c = compare_runs(a, b, docs[i].findings, docs[j].findings, run_noise=0.0)
            judged = compare_runs(a, b, docs[i].findings, docs[j].findings)
            verdicts[judged.verdict] += 1
            if c.speedup_ci is not None:
                widths.append((math.log(c.speedup_ci[1]) - math.log(c.speedup_ci[0])) / 2)
            if i == 0:
                if not rates and c.before.rate:
                    rates.append(c.before.rate)
                if c.after.rate:
                    rates.append(c.after.rate)
    logs = [math.log(r) for r in rates]
    between = statistics.stdev(logs) if len(logs) > 1 else float("nan")
    within = statistics.fmean(widths) / 1.96 / math.sqrt(2) if widths else float("nan")
    print(f"command: python benchmarks/compare_reruns.py --runs {args.runs}"
          + (f" -- {' '.join(args.job)}" if args.job else ""))  # fmt: skip
    print(f"machine: {os.cpu_count()} CPUs; load average {load:.2f} at the start, "
          f"{os.getloadavg()[0]:.2f} at the end; {time.time() - started:.0f} s")
    print()
    print("| runs | pairs | throughput per run (median, min..max) | run-to-run log sd "
          "| within-run log sd (bootstrap) | RUN_NOISE | verdicts of the pairs |")
    print("|---|---|---|---|---|---|---|")
    shown = ", ".join(f"{k} {v}" for k, v in sorted(verdicts.items()))
    print(f"| {len(rates)} | {sum(verdicts.values())} | {statistics.median(rates):.1f} "
          f"({min(rates):.1f}..{max(rates):.1f}) | {between:.3f} | {within:.3f} | "
          f"{RUN_NOISE} | {shown} |")
    print()
    print("rates, in run order: " + ", ".join(f"{r:.1f}" for r in rates))


if __name__ == "__main__":
    main()
