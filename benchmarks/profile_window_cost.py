"""What the probe's torch.profiler window costs a job (trainmedic.probe.profile_window).

Each job of ``bench_models`` (``overhead_job.py --model NAME``) runs under
``trainmedic run --quiet --no-html`` twice a round - with the window
(``TRAINMEDIC_PROBE_PROFILE=always``: on this CPU machine the window records
CPU activities, Python stacks and memory events, as on a GPU job less CUDA's
activities) and without (``off``) - in rounds that alternate their order.
Per model, medians over the rounds:

* what the job measures: its mean step over the whole loop, with the window
  against without (the same round), as a ratio; on a job of a few seconds
  this is the whole first window's cost spread over a short loop;
* what the window reports (its ``profile_window`` event): the profiler's
  start and stop on the training thread, the profiled steps' median against
  the median of the steps before, the whole cost (start + stop + the profiled
  steps' extra time), the writing on the probe's own thread, the trace's size;
* that cost as a share of the time to the next window (``REPEAT_S``, or longer
  when the cost is more than ``MAX_COST_SHARE`` of it): what a long job pays.

    python benchmarks/profile_window_cost.py [--models mlp,deep,transformer] [--rounds 5]
        [--seconds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
JOB = HERE / "overhead_job.py"
sys.path.insert(0, str(HERE.parent / "src"))

from trainmedic.probe.profile_window import MAX_COST_SHARE, REPEAT_S  # noqa: E402


def bench_line(stdout: str) -> dict[str, float]:
    for line in stdout.splitlines():
        if line.startswith("BENCH "):
            data: dict[str, float] = json.loads(line[6:])
            return data
    raise RuntimeError(f"the job printed no BENCH line:\n{stdout[-2000:]}")


def run(model: str, steps: int, mode: str, run_dir: Path) -> tuple[float, dict[str, Any] | None]:
    """The job's mean step (seconds) under ``trainmedic run``, and its window's event data."""
    argv = [sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html", "--out",
            str(run_dir), "--", sys.executable, str(JOB), "--model", model, "--steps",
            str(steps)]  # fmt: skip
    env = dict(os.environ, TRAINMEDIC_PROBE_PROFILE=mode)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
    window = None
    for line in (run_dir / "events.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["kind"] == "profile_window" and "path" in event["data"]:
            window = event["data"]
    return bench_line(done.stdout)["step_mean_s"], window


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", default="mlp,deep,transformer")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4.0, help="each job's loop")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            probe = subprocess.run([sys.executable, str(JOB), "--model", model, "--steps", "40"],
                                   capture_output=True, text=True, check=True)  # fmt: skip
            steps = max(200, int(args.seconds / bench_line(probe.stdout)["step_mean_s"]))
            ratios: list[float] = []
            windows: list[dict[str, Any]] = []
            for r in range(args.rounds):
                order = ("always", "off") if r % 2 == 0 else ("off", "always")
                got: dict[str, float] = {}
                for mode in order:
                    mean, window = run(model, steps, mode, Path(tmp) / f"{model}-{r}-{mode}")
                    got[mode] = mean
                    if mode == "always":
                        if window is None:
                            raise RuntimeError(f"{model}: no window was recorded")
                        windows.append(window)
                ratios.append(got["always"] / got["off"])
            rows.append((model, steps, ratios, windows))
    print(f"rounds: {args.rounds}, loop ~{args.seconds:g} s each; medians over the rounds\n")
    print("| job | steps | job's mean step, window / none | start + stop (ms) | "
          "profiled step / before | window's cost (ms) | write, own thread (ms) | "
          "trace (KiB) | cost / time to next window |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for model, steps, ratios, windows in rows:
        def med(key: str, ws: list[dict[str, Any]] = windows) -> float:
            return statistics.median(float(w[key]) for w in ws)

        profiled = statistics.median(w["step_s_profiled"] / w["step_s_before"] for w in windows)
        cost = med("cost_s")
        next_s = max(REPEAT_S, cost / MAX_COST_SHARE)
        print(f"| {model} | {steps} | {statistics.median(ratios):.3f} "
              f"({min(ratios):.3f}..{max(ratios):.3f}) | "
              f"{(med('start_s') + med('stop_s')) * 1000:.1f} | {profiled:.2f}x | "
              f"{cost * 1000:.1f} | {med('write_s') * 1000:.0f} | {med('bytes') / 1024:.0f} | "
              f"{cost / next_s:.2e} |")  # fmt: skip


if __name__ == "__main__":
    main()
