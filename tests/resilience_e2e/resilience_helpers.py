"""Running ``trainmedic run`` on the fault scripts and reading what it recorded."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TRAINMEDIC = [sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html"]


@dataclass
class Run:
    """One finished ``trainmedic run``: its exit code, output and run directory."""

    returncode: int
    stdout: str
    stderr: str
    run_dir: Path
    state: Path
    wall_s: float

    @property
    def attempts(self) -> list[dict[str, Any]]:
        """The ``attempt_end`` events' data, in order."""
        events = [
            json.loads(line)
            for line in (self.run_dir / "events.jsonl").read_text().splitlines()
            if line.strip()
        ]
        found = [e["data"] for e in events if e["kind"] == "attempt_end"]
        return sorted(found, key=lambda d: d["number"])

    @property
    def classes(self) -> list[str]:
        return [a["failure_class"] for a in self.attempts]

    @property
    def resumed(self) -> list[int]:
        """The steps each start of the script resumed from (its own account)."""
        return [int(x) for x in (self.state / "resumed").read_text().split()]

    @property
    def pids(self) -> list[int]:
        return [int(x) for x in (self.state / "pids").read_text().split()]

    @property
    def findings(self) -> list[dict[str, Any]]:
        return list(json.loads((self.run_dir / "findings.json").read_text())["findings"])

    def finding(self, finding_id: str) -> dict[str, Any]:
        return next(f for f in self.findings if f["id"] == finding_id)


def run_trainmedic(
    tmp_path: Path, options: list[str], command: list[str], timeout: float = 120
) -> Run:
    run_dir = tmp_path / "run"
    state = tmp_path / "state"
    t0 = time.monotonic()
    got = subprocess.run(
        [*TRAINMEDIC, "--out", str(run_dir), *options, "--", *command],
        capture_output=True,
        timeout=timeout,
        check=False,
        cwd=tmp_path,
    )
    return Run(
        got.returncode,
        got.stdout.decode("utf-8", "replace"),
        got.stderr.decode("utf-8", "replace"),
        run_dir,
        state,
        time.monotonic() - t0,
    )


def faulty(state: Path, fault: str, *args: object) -> list[str]:
    """The command line of the no-torch fault script."""
    return [
        sys.executable,
        str(SCRIPTS / "faulty.py"),
        "--state",
        str(state),
        "--fault",
        fault,
        *(str(a) for a in args),
    ]


def torch_trainer(state: Path, fault: str, *args: object) -> list[str]:
    """The command line of the PyTorch fault script."""
    return [
        sys.executable,
        str(SCRIPTS / "torch_trainer.py"),
        "--state",
        str(state),
        "--fault",
        fault,
        *(str(a) for a in args),
    ]


def left_running(pids: list[int]) -> list[int]:
    """The pids among ``pids`` still running (zombies do not count)."""
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.Error:
            continue
    return alive
