"""CPU of each thread of the supervisor (and the job) while a job runs, from ``schedstat``.

Runs ``overhead_job.py --model MODEL`` under ``trainmedic run`` once per source
tree and round (the trees alternate within a round), waits ``--settle`` seconds
into the loop, and reads ``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds on a
CPU and waiting for one) of every thread of the supervisor and of the job over
``--seconds``. Each ``--src`` is a ``src`` directory put first on ``PYTHONPATH``
(``git archive HEAD src | tar -x -C /tmp/base`` gives the code before a
change); without one, the installed trainmedic runs. Linux only.

    python benchmarks/supervisor_threads.py --src /tmp/base/src --src ../src --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def schedstat(pid: int) -> dict[int, tuple[int, int]]:
    """``{tid: (ns on a CPU, ns waiting for one)}`` of each thread of ``pid``."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                run, wait, _ = (int(x) for x in f.read().split())
        except (OSError, ValueError):
            continue  # the thread ended
        out[int(tid)] = (run, wait)
    return out


def thread_name(pid: int, tid: int) -> str:
    try:
        with open(f"/proc/{pid}/task/{tid}/comm") as f:
            return f.read().strip()
    except OSError:
        return "?"


def job_pid(supervisor: int, deadline: float) -> int | None:
    """The training job: the descendant of the supervisor running overhead_job.py."""
    while time.monotonic() < deadline:
        found = subprocess.run(
            ["pgrep", "-f", "overhead_job.py"], capture_output=True, text=True, check=False
        ).stdout.split()
        for pid in map(int, found):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    argv = f.read().split(b"\0")
            except OSError:
                continue
            # The job itself: the script is its first argument (the supervisor and
            # the session holder carry the job's command further along theirs).
            if pid != supervisor and len(argv) > 1 and argv[1].endswith(b"overhead_job.py"):
                return pid
        time.sleep(0.2)
    return None


def one_run(src: str | None, model: str, steps: int, settle: float, seconds: float) -> dict:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        job = [sys.executable, str(HERE / "overhead_job.py"), "--model", model,
               "--steps", str(steps)]  # fmt: skip
        proc = subprocess.Popen(
            [sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html",
             "--out", str(out), "--", *job],
            cwd=HERE, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            pid = job_pid(proc.pid, time.monotonic() + 60)
            if pid is None:
                raise SystemExit("the job did not start")
            time.sleep(settle)
            before = {p: schedstat(p) for p in (proc.pid, pid)}
            time.sleep(seconds)
            after = {p: schedstat(p) for p in (proc.pid, pid)}
            names = {p: {t: thread_name(p, t) for t in after[p]} for p in after}
            output, _ = proc.communicate(timeout=600)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    threads = {}
    for role, p in (("supervisor", proc.pid), ("job", pid)):
        rows = []
        for tid, (run, wait) in after[p].items():
            run0, wait0 = before[p].get(tid, (0, 0))
            rows.append({
                "tid": tid,
                "name": names[p][tid],
                "cpu_pct": (run - run0) / 1e7 / seconds,
                "wait_pct": (wait - wait0) / 1e7 / seconds,
            })  # fmt: skip
        threads[role] = sorted(rows, key=lambda r: -r["cpu_pct"])
    bench = next((line for line in output.splitlines() if line.startswith("BENCH ")), None)
    median = json.loads(bench[6:])["step_median_s"] if bench else None
    return {"src": src or "installed", "threads": threads, "step_median_s": median}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", default=[], help="a src tree (repeatable)")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--steps", type=int, default=24000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=6.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    trees = args.src or [None]
    for r in range(1, args.rounds + 1):
        for src in trees:
            result = one_run(src, args.model, args.steps, args.settle, args.seconds)
            print(f"round {r} {result['src']}: job step median {result['step_median_s']}")
            for role in ("supervisor", "job"):
                busy = [t for t in result["threads"][role] if t["cpu_pct"] >= 0.05]
                cells = ", ".join(
                    f"{t['tid']} {t['name']} {t['cpu_pct']:.2f} % (waits {t['wait_pct']:.2f} %)"
                    for t in busy
                )
                print(f"  {role}: {cells}")


if __name__ == "__main__":
    main()
