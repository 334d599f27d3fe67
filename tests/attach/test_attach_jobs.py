"""``trainmedic attach`` on real jobs started without trainmedic: the first finding names
the cause, and the job keeps running and ends as it would have."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from support.processes import kill_tree
from trainmedic.attach.access import read_problem
from trainmedic.supervise.hang.forensics import find_py_spy

pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed")

SCRIPT = Path(__file__).resolve().parent / "scripts" / "train_job.py"
WATCH_S = 4


class Job:
    """A training job in a session of its own, started ``via`` a wrapper or not."""

    def __init__(self, kind: str, seconds: float, via: tuple[str, ...] = ()) -> None:
        self.proc = subprocess.Popen(
            [*via, sys.executable, str(SCRIPT), kind, str(seconds)],
            stdout=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        assert ready and self.proc.stdout.readline().strip() == "ready"

    def finish(self, timeout: float = 60) -> tuple[int, str]:
        out, _ = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, out

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def attach(pid: int, tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str],
                                                           dict[str, Any]]:  # fmt: skip
    out = tmp_path / "attach.json"
    done = subprocess.run(
        [sys.executable, "-m", "trainmedic", "attach", str(pid), "--seconds", str(WATCH_S),
         "--json", str(out), *extra],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr + done.stdout
    doc = json.loads(out.read_text())
    unavailable = doc["context"]["stacks_unavailable"] or ""
    if read_problem(pid) is not None or any(
        m in unavailable for m in ("ermission", "not permitted", "ptrace")
    ):
        # A machine that does not let one process read another's memory (a container
        # without CAP_SYS_PTRACE): attach said why; its judgment cannot be tested here.
        pytest.skip(f"stacks cannot be read here: {unavailable or read_problem(pid)}")
    return done, doc


def test_a_job_loading_its_own_batches_under_a_shell_is_named_and_unharmed(
    tmp_path: Path,
) -> None:
    job = Job("loader", WATCH_S + 6, via=("bash", "-c", 'exec "$@"; true', "bash"))
    try:
        started = time.monotonic()
        _, doc = attach(job.proc.pid, tmp_path)
        first = doc["findings"][0]
        assert (first["id"], first["category"]) == ("input.workers", "framework_config")
        assert first["evidence"]["in_training_thread_share"] >= 0.5
        assert first["evidence"]["workers"] == 0 and "num_workers=" in first["fix"]
        (thread,) = doc["context"]["training_threads"]
        assert thread["samples"] >= 20 * WATCH_S
        assert time.monotonic() - started < WATCH_S + 30
        code, out = job.finish()
        assert code == 0 and out.strip().startswith("done ")
    finally:
        job.kill()


def test_a_compute_bound_job_gets_no_warning(tmp_path: Path) -> None:
    job = Job("compute", WATCH_S + 6)
    try:
        _, doc = attach(job.proc.pid, tmp_path)
        problems = [f for f in doc["findings"] if f["severity"] != "info"]
        assert problems == [], problems
        assert doc["findings"][0]["id"] == "run.healthy"
        split = doc["context"]["training_threads"][0]["time_split"]
        training = sum(v["share"] for k, v in split.items() if k != "host")
        assert training >= 0.8, split
        code, _ = job.finish()
        assert code == 0
    finally:
        job.kill()


def test_a_job_stuck_on_a_lock_is_a_hang_at_its_line(tmp_path: Path) -> None:
    job = Job("lock", 120)
    try:
        assert job.proc.stdout is not None and job.proc.stdout.readline().strip() == "stuck"
        _, doc = attach(job.proc.pid, tmp_path, "--dump", str(tmp_path / "dump"))
        (hang,) = doc["findings"]
        assert (hang["id"], hang["category"], hang["severity"]) == ("failure.hang", "timeout",
                                                                    "error")  # fmt: skip
        assert hang["evidence"]["silence"] == "blocked"
        assert hang["evidence"]["location"].endswith("train_job.py:" + _line("lock.acquire()  #"))
        assert "lock.acquire" in hang["title"]
        holder = hang["evidence"]["holder"]
        assert holder["self"] and holder["lock"] == "lock"
        assert holder["at"] == "train_job.py:" + _line("lock.acquire()\n", exact="lock.acquire()")
        assert "RLock" in hang["fix"]
        stacks = (tmp_path / "dump" / "stacks.txt").read_text()
        assert "train_job.py" in stacks and "MainThread" in stacks
        # A stuck job's native frames are dumped too: the C call it waits in.
        native = (tmp_path / "dump" / f"native-{job.proc.pid}.txt").read_text()
        assert "acquire" in native and "train_job.py" in native
        assert job.proc.poll() is None  # still there: attach never stops a job
    finally:
        job.kill()


def test_a_lock_kept_by_another_thread_names_that_thread(tmp_path: Path) -> None:
    job = Job("held", 120)
    try:
        assert job.proc.stdout is not None and job.proc.stdout.readline().strip() == "stuck"
        _, doc = attach(job.proc.pid, tmp_path, "--html", str(tmp_path / "a.html"))
        (hang,) = doc["findings"]
        assert hang["id"] == "failure.hang" and hang["evidence"]["silence"] == "blocked"
        holder = hang["evidence"]["holder"]
        assert (holder["self"], holder["thread"], holder["lock"]) == (False, "keeper", "lock")
        assert holder["at"] == "train_job.py:" + _line("with lock:  # the keeper")
        assert "keeper" in hang["title"]
        page = (tmp_path / "a.html").read_text()
        assert "failure.hang" in page and "Processes" in page
        assert job.proc.poll() is None
    finally:
        job.kill()


def _line(marker: str, exact: str | None = None) -> str:
    lines = SCRIPT.read_text().splitlines()
    if exact is not None:
        return str(next(i for i, line in enumerate(lines, 1) if line.strip() == exact))
    return str(next(i for i, line in enumerate(lines, 1) if marker in line))


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["999999999"], "no process 999999999 is running"),
        (["0"], "0"),
        (["abc"], "abc"),
    ],
)
def test_a_pid_that_is_no_job_is_one_line(argv: list[str], says: str) -> None:
    done = subprocess.run([sys.executable, "-m", "trainmedic", "attach", *argv, "--seconds", "1"],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in done.stderr


def test_a_process_without_python_is_one_line(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        done = subprocess.run(
            [sys.executable, "-m", "trainmedic", "attach", str(sleeper.pid), "--seconds", "1"],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 2
        assert done.stderr.strip() == (f"trainmedic: error: process {sleeper.pid} (sleep 30) "
                                       "runs no Python, and none below it does")  # fmt: skip
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_dump_folder_that_is_not_empty_is_refused_before_watching(tmp_path: Path) -> None:
    (tmp_path / "dump").mkdir()
    (tmp_path / "dump" / "mine.txt").write_text("the user's")
    done = subprocess.run(
        [sys.executable, "-m", "trainmedic", "attach", str(os.getpid()), "--dump",
         str(tmp_path / "dump")], capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "not an empty directory" in done.stderr
    assert (tmp_path / "dump" / "mine.txt").read_text() == "the user's"


@pytest.mark.slow
def test_under_torchrun_the_agent_leads_to_the_rank_the_others_wait_for(tmp_path: Path) -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not beside this interpreter")
    script = SCRIPT.with_name("ddp_job.py")
    proc = subprocess.Popen(
        [str(torchrun), "--nproc-per-node", "2", "--master-port", str(29500 + os.getpid() % 400),
         str(script), "rank1-stops", "300"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline().strip() for _ in range(2)]
        assert sorted(lines) == ["ready", "stopped"], lines
        _, doc = attach(proc.pid, tmp_path)
        roles = sorted(p["role"] for p in doc["context"]["processes"])
        assert roles == ["launcher", "training", "training"]
        (hang,) = doc["findings"]
        assert hang["id"] == "failure.hang" and hang["evidence"]["culprit_rank"] == 1
        assert hang["evidence"]["location"].endswith("ddp_job.py:" + str(next(
            i for i, line in enumerate(script.read_text().splitlines(), 1)
            if "time.sleep(3600)" in line)))  # fmt: skip
        silences = {p.get("rank"): p["silence"] for p in hang["evidence"]["processes"]}
        assert silences == {0: "peer_wait", 1: "blocked"}
    finally:
        kill_tree(proc)


def _without_ptrace() -> list[str] | None:
    """A prefix that runs a command as root without CAP_SYS_PTRACE (``None``: cannot here)."""
    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        return None
    return [setpriv, "--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace", "--"]


def test_without_the_right_to_read_the_job_it_says_how_and_keeps_what_proc_shows(
    tmp_path: Path,
) -> None:
    # The job runs as another user ("nobody"); attach runs as root without CAP_SYS_PTRACE,
    # as in a container started without --cap-add SYS_PTRACE.
    prefix = _without_ptrace()
    python = os.path.realpath(sys.executable)
    if prefix is None or not os.access(python, os.X_OK):
        pytest.skip("needs root and setpriv to drop CAP_SYS_PTRACE")
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"]
    job = subprocess.Popen(
        [*nobody, python, "-c", "import time\nprint('ready', flush=True)\n"
         "while True:\n    sum(range(20000)); time.sleep(0.002)"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/",
    )  # fmt: skip
    try:
        assert job.stdout is not None
        ready, _, _ = select.select([job.stdout], [], [], 30)
        if not ready or job.stdout.readline().strip() != "ready":
            pytest.skip("user 65534 cannot run this interpreter here")
        out = tmp_path / "attach.json"
        done = subprocess.run(
            [*prefix, sys.executable, "-m", "trainmedic", "attach", str(job.pid), "--seconds",
             "2", "--json", str(out)], capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
        doc = json.loads(out.read_text())
        first = doc["findings"][0]
        assert first["id"] == "probe.not_loaded"
        assert "CAP_SYS_PTRACE" in first["evidence"]["reason"]
        assert "--cap-add SYS_PTRACE" in first["title"]
        # What /proc shows is still there: the process, its CPU, and no healthy verdict.
        assert [p["pid"] for p in doc["context"]["processes"]] == [job.pid]
        assert "run.healthy" not in {f["id"] for f in doc["findings"]}
        # One line per process in the terminal, whatever its arguments hold.
        described = next(line for line in done.stdout.splitlines() if f"pid {job.pid}," in line)
        assert "import time\\nprint" in described
        assert job.poll() is None
    finally:
        job.kill()
        job.wait(10)
