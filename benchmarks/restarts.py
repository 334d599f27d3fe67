"""Hang detection latency and recovery time of ``trainmedic run``, and torchrun on the same hang.

For each step time, ``benchmarks/hang_job.py`` (steady steps, its own
checkpoint every 5 steps, a hang at step 20 of its first attempt) runs under
``trainmedic run`` with the learned timeout (``--timeout-floor`` FLOOR, so
the bound is ``max(FLOOR, 5 x the longest step)``) or a fixed ``--timeout``.
Measured from the job's own wall-clock stamps and the run record:

* **detection latency**: from the moment the job entered the hang to the
  watchdog's verdict (the bound plus the watchdog's reaction);
* **over the bound**: detection latency minus the bound in force;
* **recovery**: from the verdict to the end of the first step of the resumed
  attempt (stacks, stop, restart, the interpreter's start, resume).

Then the same job runs under ``python -m torch.distributed.run --standalone
--nproc-per-node 1 --max-restarts 3`` for three times trainmedic's longest
detection latency after the hang began: torchrun restarts workers that
exit, so a hung worker is never restarted.

    python benchmarks/restarts.py [--step-times 0.01 0.1 0.5] [--repeats 3] [--floor 2]
                                  [--torch] [--no-torchrun] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

HERE = Path(__file__).resolve().parent
JOB = HERE / "hang_job.py"


def wait_for_time(path: Path, timeout: float) -> float | None:
    """The Unix time the job wrote to ``path``, once it is there (``None`` on timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return float(path.read_text())
        except (OSError, ValueError):  # not there yet, or being written
            time.sleep(0.05)
    return None


def trainmedic_once(
    step_s: float, timeout: list[str], workdir: Path, torch: bool = False
) -> dict[str, Any]:
    state, run_dir = workdir / "state", workdir / "run"
    cmd = [
        sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html", "--out", str(run_dir),
        "--backoff", "0", "--grace", "2", *timeout, "--",
        sys.executable, str(JOB), "--state", str(state), "--step-s", str(step_s),
        *(["--import-torch"] if torch else []),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=600)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    first = next(e["data"] for e in events if e["kind"] == "attempt_end")
    hang = next(e["data"] for e in events if e["kind"] == "hang_detected")
    hang_start = float((state / "hang_start").read_text())
    resumed = float((state / "first_resumed_step").read_text())
    detected = float(first["detected_at"])
    return {
        "detection_s": detected - hang_start,
        "bound_s": float(first["hang"]["bound_s"]),
        "over_bound_s": detected - hang_start - float(first["hang"]["bound_s"]),
        "recovery_s": resumed - detected,
        "forensics_s": float(hang["forensics_s"]),
        "stop_s": float(first["stop"]["took_s"]) if first.get("stop") else None,
    }


def torchrun_once(step_s: float, watch_s: float, workdir: Path) -> dict[str, Any]:
    state = workdir / "state"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
        "--max-restarts", "3", str(JOB), "--state", str(state), "--step-s", str(step_s),
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        hang_start = wait_for_time(state / "hang_start", 120)
        if hang_start is None:
            raise RuntimeError("the job under torchrun never reached its hang")
        time.sleep(max(0.0, hang_start + watch_s - time.time()))
        starts = (state / "starts").read_text().split()
        return {
            "watched_s": time.time() - hang_start,
            "torchrun_running": proc.poll() is None,
            "restarts": len(starts) - 1,
            "resumed": (state / "first_resumed_step").exists(),
        }
    finally:
        # torchrun starts its workers in sessions of their own: kill them by pid.
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    child.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-times", type=float, nargs="+", default=[0.01, 0.1, 0.5])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--floor", type=float, default=2.0, help="--timeout-floor, seconds")
    parser.add_argument("--fixed", type=float, default=2.0, help="--timeout for fixed runs")
    parser.add_argument("--json", default=None, help="write the results to this file")
    parser.add_argument(
        "--torch", action="store_true", help="the job imports torch at each start (recovery)"
    )
    parser.add_argument("--no-torchrun", action="store_true", help="skip the torchrun runs")
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    modes = {
        "learned": ["--timeout-floor", str(args.floor)],
        "fixed": ["--timeout", str(args.fixed)],
    }
    print("| step | timeout | bound | detection (median, max) | over the bound | recovery |")
    print("|---|---|---|---|---|---|")
    for step_s in args.step_times:
        for mode, option in modes.items():
            runs = []
            for _ in range(args.repeats):
                with tempfile.TemporaryDirectory(prefix="tm-bench-") as tmp:
                    runs.append(trainmedic_once(step_s, option, Path(tmp), args.torch))
            row = {
                "step_s": step_s,
                "mode": mode,
                "torch": args.torch,
                "bound_s": statistics.median(r["bound_s"] for r in runs),
                "detection_median_s": statistics.median(r["detection_s"] for r in runs),
                "detection_max_s": max(r["detection_s"] for r in runs),
                "over_bound_median_s": statistics.median(r["over_bound_s"] for r in runs),
                "recovery_median_s": statistics.median(r["recovery_s"] for r in runs),
                "forensics_median_s": statistics.median(r["forensics_s"] for r in runs),
                "runs": runs,
            }
            results.append(row)
            print(
                f"| {step_s * 1000:g} ms | {mode} | {row['bound_s']:.2f} s | "
                f"{row['detection_median_s']:.2f} s, {row['detection_max_s']:.2f} s | "
                f"{row['over_bound_median_s']:+.2f} s | {row['recovery_median_s']:.2f} s |",
                flush=True,
            )
    if args.no_torchrun:
        return _write(args.json, results, [])
    longest = max(r["detection_max_s"] for r in results)
    print()
    print("| step | torchrun --max-restarts 3, watched after the hang | still running | "
          "restarts | resumed |")  # fmt: skip
    print("|---|---|---|---|---|")
    comparisons = []
    for step_s in args.step_times:
        with tempfile.TemporaryDirectory(prefix="tm-bench-") as tmp:
            seen = torchrun_once(step_s, 3 * longest, Path(tmp))
        seen["step_s"] = step_s
        comparisons.append(seen)
        print(
            f"| {step_s * 1000:g} ms | {seen['watched_s']:.1f} s | {seen['torchrun_running']} | "
            f"{seen['restarts']} | {seen['resumed']} |",
            flush=True,
        )
    _write(args.json, results, comparisons)


def _write(path: str | None, results: list[Any], comparisons: list[Any]) -> None:
    if path:
        Path(path).write_text(
            json.dumps({"trainmedic": results, "torchrun": comparisons}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
