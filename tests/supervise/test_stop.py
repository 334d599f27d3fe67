"""Stopping a job: SIGTERM to the group, grace, SIGKILL, no process left behind."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil

from trainmedic.supervise.launch.launcher import Job
from trainmedic.supervise.launch.stop import caught_signals, stop_job, wait_gpu_release

# A leader that ignores SIGTERM, with a child in the group that ignores it too and a
# grandchild in a session of its own (it left the group). Each writes its pid.
TREE = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
out = sys.argv[1]
kids = [
    subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"]),
    subprocess.Popen(["sleep", "60"], start_new_session=True),
]
with open(out, "w") as f:
    f.write(" ".join(str(p) for p in [os.getpid(), *(k.pid for k in kids)]))
time.sleep(60)
"""


def start(tmp_path: Path, code: str) -> tuple[Job, list[int]]:
    out = tmp_path / "pids"
    r, w = os.pipe()
    os.close(r)
    job = Job.start(
        [sys.executable, "-c", code, str(out)], dict(os.environ), stdout_fd=w, stderr_fd=w
    )
    os.close(w)
    deadline = time.monotonic() + 10
    while not (out.exists() and len(out.read_text().split()) == 3):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return job, [int(p) for p in out.read_text().split()]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_processes_that_ignore_sigterm_or_left_the_group_are_killed(tmp_path: Path) -> None:
    job, pids = start(tmp_path, TREE)
    report = stop_job(job, grace_s=0.3)
    assert set(pids) <= set(report.pids)
    assert report.survivors == ()
    assert job.returncode == -9  # the leader ignored SIGTERM: killed
    # An ignored signal stays ignored across exec: `sleep` ignores SIGTERM too.
    assert set(report.killed) == set(pids)
    assert 0.3 <= report.took_s < 5
    assert not [p for p in pids if alive(p)]


def test_a_job_that_obeys_sigterm_is_not_killed(tmp_path: Path) -> None:
    code = TREE.replace("signal.signal(signal.SIGTERM, signal.SIG_IGN)", "pass")
    job, pids = start(tmp_path, code)
    report = stop_job(job, grace_s=5.0)
    assert report.killed == ()
    assert set(report.terminated) == set(pids)
    assert job.returncode == -15
    assert report.took_s < 3  # no waiting for the grace period to run out
    assert not [p for p in pids if alive(p)]


def test_the_wait_for_gpu_memory_is_bounded() -> None:
    listed = [{1, 2}, {2}, set()]
    naps: list[float] = []
    t = [0.0]

    def clock() -> float:
        return t[0]

    def sleep(s: float) -> None:
        naps.append(s)
        t[0] += s

    assert wait_gpu_release([2], lambda: listed.pop(0), 10, clock, sleep) == (True, 1.0)
    assert wait_gpu_release([2], lambda: {2}, 2.0, clock, sleep) == (False, 2.0)
    assert wait_gpu_release([2], lambda: None, 2.0, clock, sleep)[0] is None


def test_caught_signals_reads_the_handler_mask() -> None:
    import signal

    # A handler of this test's own: Python's KeyboardInterrupt handler is not there
    # when the tests start with SIGINT ignored (a background job of a shell script).
    previous = signal.signal(signal.SIGUSR2, lambda *_: None)
    try:
        caught = caught_signals(os.getpid())
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert caught is not None
    assert signal.SIGUSR2 in caught
    if previous == signal.SIG_DFL:  # the handler gone, the mask says so
        assert signal.SIGUSR2 not in (caught_signals(os.getpid()) or set())
    assert caught_signals(2**22 + 12345) is None


# Run in a process of its own: it becomes a child subreaper, as trainmedic does, and
# has a helper child of its own that is not the job (a resource tracker, a keeper).
ADOPTING_SUPERVISOR = """
import json, os, subprocess, sys, time
from trainmedic.supervise.launch.launcher import Job, become_subreaper
from trainmedic.supervise.launch.stop import stop_job
assert become_subreaper()
helper = subprocess.Popen(["sleep", "60"])
orphan_file = sys.argv[1]
job = Job.start([sys.executable, "-c",
    "import subprocess, sys; p = subprocess.Popen(['sleep', '60'], start_new_session=True);"
    "open(sys.argv[1], 'w').write(str(p.pid))", orphan_file], dict(os.environ),
    stdout_fd=2, stderr_fd=2)
job.wait(10)  # the leader exits at once: its child is re-parented to us
deadline = time.monotonic() + 10
while not os.path.getsize(orphan_file) if os.path.exists(orphan_file) else True:
    assert time.monotonic() < deadline
    time.sleep(0.02)
orphan = int(open(orphan_file).read())
seen = sorted(p.pid for p in job.descendants())
report = stop_job(job, grace_s=0.2)
print(json.dumps({"helper": helper.pid, "helper_running": helper.poll() is None,
                  "orphan": orphan, "seen": seen, "killed": list(report.killed),
                  "terminated": list(report.terminated)}))
helper.kill()
"""


def test_only_the_jobs_orphans_are_adopted_not_the_supervisors_own_children(
    tmp_path: Path,
) -> None:
    import json
    import subprocess

    out = subprocess.run(
        [sys.executable, "-c", ADOPTING_SUPERVISOR, str(tmp_path / "orphan")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    got = json.loads(out.stdout)
    assert got["seen"] == [got["orphan"]]
    assert got["orphan"] in got["terminated"]
    assert got["helper"] not in got["killed"] + got["terminated"]
    assert got["helper_running"]
    assert not alive(got["orphan"])


def test_a_job_that_left_its_group_itself_is_stopped(tmp_path: Path) -> None:
    """The job may call setsid(): the group's signal misses it, so it is sent one directly."""
    code = TREE.replace("out = sys.argv[1]", "os.setsid()\nout = sys.argv[1]")
    job, pids = start(tmp_path, code)
    assert os.getpgid(pids[0]) != job.pgid
    report = stop_job(job, grace_s=0.3)
    assert report.survivors == ()
    assert job.returncode == -9
    assert pids[0] in report.killed
    assert not [p for p in pids if alive(p)]
