"""Hang detection and recovery of ``trainmedic run``, side by side with torchrun and
NVIDIA's ``ft_launcher``; and a job that keeps crashing, run to its end.

**Hangs.** ``benchmarks/hang_job.py`` (steady steps of ``--step-s``, its own
checkpoint every 5 steps, a hang at step 20 of its first attempt: a sleep
loop, a lock nobody releases, a Python busy loop) runs under

* ``trainmedic run`` with the defaults, and with ``--timeout-floor 5``: no
  change to the job;
* ``ft_launcher`` (NVIDIA Resiliency Extension) with
  ``--ft-rank-heartbeat-timeout 5``: the job sends a heartbeat each step
  (``--nvrx``: the code change NVRx needs);
* ``torchrun --max-restarts 3``, watched for three times trainmedic's
  longest detection.

From the job's own wall-clock stamps, the run record and the launchers' logs:
**detection** (hang -> verdict) and **resumed** (hang -> the end of the first
step of the resumed attempt).

**Crash loop** (``--crash-loop``). The job crashes (SIGSEGV) after every
``--crash-every`` seconds of training, ``--crashes`` times, and resumes from
its checkpoint each time; the same steps run once without faults. Both under
``trainmedic run`` with the defaults, and the faulty one under
``torchrun --max-restarts 3`` (whose count never resets). Reported: whether
each finished, and the fault-free wall time over the faulty one.

    python benchmarks/restarts.py [--hangs sleep lock busy] [--step-s 0.05] [--repeats 3]
                                  [--torch] [--no-torchrun] [--no-nvrx] [--json FILE]
    python benchmarks/restarts.py --crash-loop [--crash-every 30] [--crashes 5] [--torch]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import re
import shutil
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
BIN = Path(sys.executable).parent


def wait_for_time(path: Path, timeout: float) -> float | None:
    """The Unix time the job wrote to ``path``, once it is there (``None`` on timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return float(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):  # not there yet, or being written
            time.sleep(0.05)
    return None


def job_args(state: Path, step_s: float, kind: str, torch: bool) -> list[str]:
    return [
        str(JOB), "--state", str(state), "--step-s", str(step_s), "--hang", kind,
        *(["--import-torch"] if torch else []),
    ]  # fmt: skip


def trainmedic_once(
    step_s: float, kind: str, options: list[str], workdir: Path, torch: bool
) -> dict[str, Any]:
    state, run_dir = workdir / "state", workdir / "run"
    cmd = [
        sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html", "--out", str(run_dir),
        "--grace", "2", *options, "--", sys.executable, *job_args(state, step_s, kind, torch),
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, timeout=900)
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    first = next(e["data"] for e in events if e["kind"] == "attempt_end")
    hang_start = float((state / "hang_start").read_text())
    resumed = float((state / "first_resumed_step").read_text())
    detected = float(first["detected_at"])
    return {
        "detection_s": detected - hang_start,
        "resumed_s": resumed - hang_start,
        "restart_s": resumed - detected,
        "bound_s": float(first["hang"]["bound_s"]),
        "silence": first["hang"].get("silence"),
        "wait_s": float(first["wait_s"]),
    }


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    # Launchers start their workers in sessions of their own: kill them by pid.
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(proc.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def torchrun_once(step_s: float, kind: str, watch_s: float, workdir: Path) -> dict[str, Any]:
    state = workdir / "state"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
        "--max-restarts", "3", *job_args(state, step_s, kind, False),
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        hang_start = wait_for_time(state / "hang_start", 120)
        if hang_start is None:
            raise RuntimeError("the job under torchrun never reached its hang")
        time.sleep(max(0.0, hang_start + watch_s - time.time()))
        starts = (state / "starts").read_text().splitlines()
        return {
            "watched_s": time.time() - hang_start,
            "running": proc.poll() is None,
            "restarts": len(starts) - 1,
            "resumed": (state / "first_resumed_step").exists(),
        }
    finally:
        _kill_tree(proc)


_LOG_TIME = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]")


def nvrx_once(step_s: float, kind: str, workdir: Path, torch: bool) -> dict[str, Any]:
    """``ft_launcher`` with a 5 s rank heartbeat timeout; the job sends heartbeats."""
    state = workdir / "state"
    log = workdir / "ft.log"
    cmd = [
        str(BIN / "ft_launcher"), "--nproc-per-node", "1", "--max-restarts", "3",
        "--ft-initial-rank-heartbeat-timeout", "60", "--ft-rank-heartbeat-timeout", "5",
        *job_args(state, step_s, kind, torch), "--nvrx",
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, start_new_session=True)
        try:
            resumed = wait_for_time(state / "first_resumed_step", 300)
            done = wait_for_time(state / "done", 60)
            proc.wait(timeout=120)
        finally:
            _kill_tree(proc)
    hang_start = float((state / "hang_start").read_text())
    detected = None
    for line in log.read_text(errors="replace").splitlines():
        m = _LOG_TIME.match(line)
        if m and "failed (exitcode" in line:
            stamp = datetime.datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f")
            detected = stamp.timestamp()
            break
    return {
        "detection_s": None if detected is None else detected - hang_start,
        "resumed_s": None if resumed is None else resumed - hang_start,
        "finished": done is not None,
    }


def crash_loop(args: argparse.Namespace) -> dict[str, Any]:
    steps = int(args.crash_every / args.step_s) * (args.crashes + 1)
    common = [
        "--step-s", str(args.step_s), "--total-steps", str(steps),
        *(["--import-torch"] if args.torch else []),
    ]  # fmt: skip
    results: dict[str, Any] = {"steps": steps}
    for name, crashes in (("fault_free", 0), ("crashing", args.crashes)):
        with tempfile.TemporaryDirectory(prefix="tm-bench-") as tmp:
            state, run_dir = Path(tmp) / "state", Path(tmp) / "run"
            job = [str(JOB), "--state", str(state), *common]
            job += ["--crash-after-s", str(args.crash_every), "--crashes", str(crashes)]
            t0 = time.time()
            got = subprocess.run(
                [sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html",
                 "--out", str(run_dir), "--", sys.executable, *job],
                capture_output=True, timeout=3600, check=False,
            )  # fmt: skip
            wall = time.time() - t0
            events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
            attempts = [e["data"] for e in events if e["kind"] == "attempt_end"]
            results[name] = {
                "returncode": got.returncode,
                "wall_s": wall,
                "finished": (state / "done").exists(),
                "attempts": len(attempts),
                "waits_s": [a["wait_s"] for a in attempts[:-1]],
            }
    results["ratio"] = results["fault_free"]["wall_s"] / results["crashing"]["wall_s"]
    if not args.no_torchrun:
        with tempfile.TemporaryDirectory(prefix="tm-bench-") as tmp:
            state = Path(tmp) / "state"
            job = [str(JOB), "--state", str(state), *common]
            job += ["--crash-after-s", str(args.crash_every), "--crashes", str(args.crashes)]
            got = subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", "1", "--max-restarts", "3", *job],
                capture_output=True, timeout=3600, check=False,
            )  # fmt: skip
            results["torchrun"] = {
                "returncode": got.returncode,
                "finished": (state / "done").exists(),
                "starts": len((state / "starts").read_text().splitlines()),
            }
    return results


_SILENT_JOB = """
import os, sys, time, trainmedic
n = int(sys.argv[1])
for _ in range(n - 1):
    if os.fork() == 0:
        time.sleep(float(sys.argv[2]) + 30)
        os._exit(0)
for _ in range(100):
    time.sleep(0.05)
    trainmedic.step()
open(sys.argv[3], "w").write(str(time.time()))
time.sleep(float(sys.argv[2]))
"""


def observer_cost(processes: int, silence_s: float) -> dict[str, Any]:
    """The supervisor's CPU while a job of ``processes`` processes is silent (it
    reads every one of them four times a second) and while it steps."""
    with tempfile.TemporaryDirectory(prefix="tm-bench-") as tmp:
        mark = Path(tmp) / "silent"
        cmd = [
            sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html",
            "--out", str(Path(tmp) / "run"), "--timeout-floor", str(silence_s * 4), "--",
            sys.executable, "-c", _SILENT_JOB, str(processes), str(silence_s), str(mark),
        ]  # fmt: skip
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        me = psutil.Process(proc.pid)
        try:
            if wait_for_time(mark, 120) is None:
                raise RuntimeError("the job never went silent")
            time.sleep(1.0)  # the first second of a silence reads only baselines
            t0, c0 = time.monotonic(), sum(me.cpu_times()[:2])
            time.sleep(silence_s - 2.0)
            t1, c1 = time.monotonic(), sum(me.cpu_times()[:2])
            proc.wait(timeout=silence_s + 120)
        finally:
            _kill_tree(proc)
    return {"processes": processes, "cpu_pct_of_core": 100.0 * (c1 - c0) / (t1 - t0)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hangs", nargs="+", default=["sleep", "lock", "busy"])
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--torch", action="store_true", help="the job imports torch at each start")
    parser.add_argument("--no-torchrun", action="store_true")
    parser.add_argument("--no-nvrx", action="store_true")
    parser.add_argument("--crash-loop", action="store_true")
    parser.add_argument("--crash-every", type=float, default=30.0)
    parser.add_argument("--crashes", type=int, default=5)
    parser.add_argument(
        "--observer-cost",
        type=int,
        nargs="*",
        default=None,
        metavar="N",
        help="the supervisor's CPU while jobs of N processes are silent",
    )
    parser.add_argument("--json", default=None, help="write the results to this file")
    args = parser.parse_args()
    if args.observer_cost is not None:
        costs = [observer_cost(n, 20.0) for n in (args.observer_cost or [1, 8, 32])]
        for c in costs:
            print(f"| {c['processes']} | {c['cpu_pct_of_core']:.2f} % |", flush=True)
        _write(args.json, costs)
        return
    if args.crash_loop:
        results = crash_loop(args)
        print(json.dumps(results, indent=1))
        _write(args.json, results)
        return
    modes = {"trainmedic (defaults)": [], "trainmedic --timeout-floor 5": ["--timeout-floor", "5"]}
    rows: list[dict[str, Any]] = []
    print("| hang | launcher | class | detection (median, max) | hang -> resumed (median, max) |")
    print("|---|---|---|---|---|")
    for kind in args.hangs:
        for mode, options in modes.items():
            runs = []
            for _ in range(args.repeats):
                with tempfile.TemporaryDirectory(prefix="tm-bench-") as tmp:
                    runs.append(trainmedic_once(args.step_s, kind, options, Path(tmp), args.torch))
            rows.append(_row(kind, mode, runs))
        if not args.no_nvrx and shutil.which("ft_launcher", path=str(BIN)):
            runs = []
            for _ in range(args.repeats):
                with tempfile.TemporaryDirectory(prefix="tm-bench-") as tmp:
                    runs.append(nvrx_once(args.step_s, kind, Path(tmp), args.torch))
            rows.append(_row(kind, "ft_launcher, 5 s heartbeat timeout (job changed)", runs))
        if not args.no_torchrun:
            seen_s = [r["detection_max_s"] for r in rows if r.get("detection_max_s") is not None]
            longest = max(seen_s)
            with tempfile.TemporaryDirectory(prefix="tm-bench-") as tmp:
                seen = torchrun_once(args.step_s, kind, 3 * longest, Path(tmp))
            rows.append({"hang": kind, "launcher": "torchrun --max-restarts 3", **seen})
            print(
                f"| {kind} | torchrun --max-restarts 3 | — | never (watched "
                f"{seen['watched_s']:.0f} s: running={seen['running']}, "
                f"restarts={seen['restarts']}) | never |",
                flush=True,
            )
    _write(args.json, rows)


def _row(kind: str, launcher: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    def stats(key: str) -> tuple[float | None, float | None]:
        values = [r[key] for r in runs if r.get(key) is not None]
        return (statistics.median(values), max(values)) if values else (None, None)

    det, res = stats("detection_s"), stats("resumed_s")
    silences = sorted({str(r.get("silence")) for r in runs if r.get("silence")})
    row = {
        "hang": kind,
        "launcher": launcher,
        "silence": silences,
        "detection_median_s": det[0],
        "detection_max_s": det[1],
        "resumed_median_s": res[0],
        "resumed_max_s": res[1],
        "runs": runs,
    }

    def fmt(pair: tuple[float | None, float | None]) -> str:
        return "—" if pair[0] is None else f"{pair[0]:.2f} s, {pair[1]:.2f} s"

    print(
        f"| {kind} | {launcher} | {', '.join(silences) or '—'} | {fmt(det)} | {fmt(res)} |",
        flush=True,
    )
    return row


def _write(path: str | None, results: Any) -> None:
    if path:
        Path(path).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
