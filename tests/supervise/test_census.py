"""The process census: which processes the job ran, and whether the probe could reach them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from trainmedic.probe import BOOTSTRAP_DIR
from trainmedic.probe import env as probe_env
from trainmedic.supervise.observe.census import (
    MAX_REPORTED,
    ProcessCensus,
    _startup_flags,
    is_python,
)


@pytest.mark.parametrize(
    ("name", "exe", "argv0", "expected"),
    [
        ("python3", None, None, True),
        ("train.py", "/usr/bin/python3.11", "/usr/bin/python3", True),  # a shebang script
        ("pypy3", None, None, True),
        ("bash", "/usr/bin/bash", "bash", False),
        ("pythonista", None, None, False),
        ("torchrun", "/opt/venv/bin/python3.12", "/opt/venv/bin/python3.12", True),
    ],
)
def test_python_is_told_by_the_executable_first(
    name: str, exe: str | None, argv0: str | None, expected: bool
) -> None:
    assert is_python(name, exe, argv0) is expected


def test_startup_flags_before_the_script_are_noted() -> None:
    assert _startup_flags(["python", "-S", "train.py", "-E"]) == ("-S",)
    assert _startup_flags(["python", "-uIB", "-m", "pkg"]) == ("-I",)
    assert _startup_flags(["python", "-c", "import x", "-S"]) == ()
    assert _startup_flags(["python", "-W", "ignore", "-E", "t.py"]) == ()  # -W takes an argument


def _spawn(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(30)"], env=env, start_new_session=True
    )


def test_a_python_child_is_described_with_its_environment(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINMEDIC_")}
    env.update({probe_env.ADDR: "unix:/nowhere", "PYTHONPATH": "/opt/project"})
    env.pop(probe_env.HOME, None)
    child = _spawn(env)
    try:
        census = ProcessCensus(started_at=time.time() - 1)
        p = psutil.Process(child.pid)
        key = (p.pid, p.create_time())
        deadline = time.monotonic() + 30
        while "-c" not in p.cmdline():  # the exec may not have happened yet
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with p.oneshot():
            census.observe(p, key, 0.25, now=key[1] + 2.0)
        census.observe(p, key, 0.5, now=key[1] + 9.0)
        event = census.event(t=key[1] + 10, probe=True)
    finally:
        child.kill()
        child.wait()
    assert event.kind == "process_census"
    assert event.data["probe"] is True
    (entry,) = event.data["processes"]
    assert entry["pid"] == child.pid and entry["python"] is True
    assert entry["argv"][1:] == ["-c", "import time; time.sleep(30)"]
    assert entry["lived_s"] == pytest.approx(9.0, abs=0.1)
    assert entry["cpu_s"] == 0.5
    assert entry["probe_env"] is True
    assert entry["pythonpath"] == "/opt/project"
    assert entry["bootstrap_on_path"] is False


def test_the_bootstrap_on_pythonpath_is_recognised(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=f"{BOOTSTRAP_DIR}{os.pathsep}/opt/x")
    child = _spawn(env)
    try:
        p = psutil.Process(child.pid)
        census = ProcessCensus(started_at=0.0)
        deadline = time.monotonic() + 30
        while "-c" not in p.cmdline():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        census.observe(p, (p.pid, p.create_time()), 0.0, now=time.time())
    finally:
        child.kill()
        child.wait()
    (entry,) = census.seen.values()
    assert entry.bootstrap_on_path is True


class FakeProcess:
    def __init__(self, pid: int, name: str) -> None:
        self.pid = pid
        self._name = name

    def name(self) -> str:
        return self._name

    def exe(self) -> str:
        return f"/usr/bin/{self._name}"

    def cmdline(self) -> list[str]:
        return [self._name, "x" * 500]

    def environ(self) -> dict[str, str]:
        return {}


def test_the_event_lists_python_first_and_stays_bounded() -> None:
    census = ProcessCensus(started_at=0.0)
    for pid in range(1, 200):
        census.observe(FakeProcess(pid, "sh"), (pid, 0.0), cpu_s=pid, now=float(pid))  # type: ignore[arg-type]
    census.observe(FakeProcess(500, "python3"), (500, 5.0), cpu_s=0.0, now=6.0)  # type: ignore[arg-type]
    data = census.event(t=300.0, probe=False).data
    assert data["processes_total"] == 200
    assert len(data["processes"]) == MAX_REPORTED
    assert data["processes"][0]["pid"] == 500
    assert data["processes"][0]["probe_env"] is False
    assert data["processes"][1]["pid"] == 199  # then the longest-lived
    assert all(len(a) <= 200 for p in data["processes"] for a in p["argv"])
