"""`trainmedic compare` under this machine's ordinary noise: reruns of one unchanged
150-step input-bound job are never `faster` or `slower` (at least 20 pairs of 8-12 runs
that met about the same CPU speed), a run
slowed by other people's processes is `inconclusive` naming the cores they used, and a
real fix (num_workers 0 -> 2, three runs a side) is `faster` with its interval."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.corpus import burners

JOB = Path(__file__).resolve().parent / "scripts" / "augment_no_workers.py"

pytestmark = pytest.mark.slow


def _run(directory: Path, *args: str, steps: int = 60) -> Path:
    done = subprocess.run(
        [sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html", "--out",
         str(directory), "--", sys.executable, str(JOB), "--steps", str(steps), *args],
        capture_output=True, text=True, timeout=300, check=False,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return directory


def _compare(*runs: Path | str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "trainmedic", "compare", *map(str, runs), "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def _cpu_speed() -> float:
    """This machine's CPU speed now: iterations of a fixed Python loop per second of the
    thread's own CPU time (unmoved by waits for a CPU; moved by the vCPU's clock, its
    host's other tenants on the same core, burstable-credit throttling)."""
    best = 0.0
    for _ in range(3):
        t0, n = time.thread_time(), 0
        while time.thread_time() - t0 < 0.05:
            for _ in range(2000):
                n += 1
        best = max(best, n / (time.thread_time() - t0))
    return best


def test_reruns_of_an_unchanged_job_are_never_faster_or_slower(tmp_path: Path) -> None:
    # Eight reruns or more. A pair whose runs met a CPU of another speed (measured before
    # and after each run, 25 % apart or more: this VM's vCPU has run the job 1.5x faster
    # a minute later, with no steal and no other process to show for it) is not "normal
    # noise" and is left out; reruns go on (12 at most) until 20 pairs remain, since a
    # CI machine once sped up 1.6x over eight runs and left 16.
    # Each run trains 150 steps (about 5 s): a 60-step run lasts 2 s, and one slow
    # episode of the VM as long as that once made a whole run 1.5x slower than the seven
    # others with nothing measured to show for it (no other process's CPU, no wait for
    # a CPU, no steal). A first run, not compared, lets what the tests before left
    # behind (exiting processes, memory being reclaimed) settle.
    _run(tmp_path / "settle")
    runs: list[Path] = []
    speeds: list[float] = []

    def comparable() -> list[tuple[int, int]]:
        return [
            (i, j)
            for i, j in itertools.combinations(range(len(runs)), 2)
            if max(speeds[i], speeds[j]) / min(speeds[i], speeds[j]) < 1.25
        ]

    while len(runs) < 8 or (len(comparable()) < 20 and len(runs) < 12):
        before = _cpu_speed()
        runs.append(_run(tmp_path / f"run-{len(runs)}", steps=150))
        speeds.append((before + _cpu_speed()) / 2)
    verdicts = {}
    for i, j in comparable():
        doc = _compare(runs[i], runs[j])
        verdicts[(runs[i].name, runs[j].name)] = (doc["verdict"], doc["speedup"])
    assert len(verdicts) >= 20, ([round(s) for s in speeds], verdicts)
    wrong = {k: v for k, v in verdicts.items() if v[0] in ("faster", "slower")}
    assert not wrong, (wrong, [round(s) for s in speeds])


def test_others_cpu_is_inconclusive_and_a_real_fix_is_faster(tmp_path: Path) -> None:
    quiet = _run(tmp_path / "quiet")
    with burners(2):
        busy = _run(tmp_path / "busy")
    slowed = _compare(quiet, busy)
    assert slowed["speedup"] < 0.85, slowed
    assert slowed["verdict"] == "inconclusive", slowed
    assert any("other processes used" in r for r in slowed["reasons"]), slowed["reasons"]
    # One pair cannot be surer than run-to-run noise allows (+-39 %); three runs a side
    # narrow that to +-21 %, and the fix (1.3x-2x here) clears it.
    quiet_runs = [quiet, *(_run(tmp_path / f"quiet-{i}") for i in (2, 3))]
    fixed_runs = [_run(tmp_path / f"workers-{i}", "--workers", "2") for i in (1, 2, 3)]
    fixed = _compare(*quiet_runs, "--", *fixed_runs)
    assert fixed["verdict"] == "faster", (fixed["speedup"], fixed["speedup_ci"], fixed["reasons"])
    lo, hi = fixed["speedup_ci"]
    assert 1.03 < lo < fixed["speedup"] < hi
