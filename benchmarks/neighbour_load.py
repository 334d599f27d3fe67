"""Does a little CPU work on the other core slow a training job? (the supervisor's share)

``trainmedic run``'s supervisor uses about 2 % of a core while a job runs
(docs/performance.md), on a machine whose other cores the job may share. This
runs the plain benchmark job (``overhead_job.py --model MODEL``) alone and with
a neighbour process beside it that spins ``--busy-ms`` and then sleeps
``--sleep-ms`` (0.5 ms every 25 ms: 2 % of a core, in bursts like the
supervisor's), interleaved for ``--rounds`` rounds, and prints the per-round
ratios of the job's median and mean step with the neighbour to without, and
their medians. Nothing of trainmedic runs: it isolates the effect of a
neighbour's CPU from everything the probe does inside the job.

    python benchmarks/neighbour_load.py [--model mlp] [--rounds 10] [--steps 5000]
        [--busy-ms 0.5] [--sleep-ms 25]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

NEIGHBOUR = """
import sys, time
busy, idle = float(sys.argv[1]), float(sys.argv[2])
while True:
    t = time.perf_counter()
    while time.perf_counter() - t < busy:
        pass
    time.sleep(idle)
"""


def run_job(model: str, steps: int) -> dict[str, float]:
    """One plain run of the benchmark job; its ``BENCH`` line."""
    done = subprocess.run(
        [sys.executable, str(HERE / "overhead_job.py"), "--model", model, "--steps", str(steps)],
        capture_output=True,
        text=True,
        cwd=HERE,
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith("BENCH ")), None)
    if done.returncode != 0 or line is None:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"neighbour_load: the job failed (exit {done.returncode}): {last}")
    return json.loads(line[len("BENCH ") :])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--busy-ms", type=float, default=0.5)
    parser.add_argument("--sleep-ms", type=float, default=25.0)
    args = parser.parse_args()
    if args.rounds < 1 or args.steps < 1 or args.busy_ms < 0 or args.sleep_ms <= 0:
        parser.error(
            "--rounds and --steps must be at least 1, --busy-ms at least 0, --sleep-ms above 0"
        )
    median_ratios, mean_ratios = [], []
    for i in range(args.rounds):
        alone = run_job(args.model, args.steps)
        neighbour = subprocess.Popen(
            [sys.executable, "-c", NEIGHBOUR, str(args.busy_ms / 1e3), str(args.sleep_ms / 1e3)]
        )
        try:
            beside = run_job(args.model, args.steps)
        finally:
            neighbour.kill()
            neighbour.wait()
        median_ratios.append(beside["step_median_s"] / alone["step_median_s"])
        mean_ratios.append(beside["step_mean_s"] / alone["step_mean_s"])
        print(
            f"round {i + 1}: median step {alone['step_median_s'] * 1e3:.3f} ms alone, "
            f"{beside['step_median_s'] * 1e3:.3f} ms beside the neighbour",
            flush=True,
        )
    share = args.busy_ms / (args.busy_ms + args.sleep_ms)
    print(
        f"\n{args.model}, neighbour busy {share:.1%} of a core, {args.rounds} rounds: "
        f"median step ratio {statistics.median(median_ratios):.3f} "
        f"(per round {min(median_ratios):.3f}..{max(median_ratios):.3f}), "
        f"mean step ratio {statistics.median(mean_ratios):.3f}"
    )


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:  # the reader (``| head``) left: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
