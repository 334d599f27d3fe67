"""When the supervisor itself dies (SIGKILL, the OOM killer), the job runs on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from .helpers import TRAINMEDIC, assert_one_line_error, trainmedic

LINES = 200

# Says "ready" once the probe is connected, waits for the test to kill the
# supervisor, then prints on; at the end it reports whether its probe noticed
# the lost supervisor and switched itself off.
JOB = textwrap.dedent(
    """
    import os, sys, time
    from trainmedic.probe import runtime
    go = sys.argv[1]
    probe = runtime.current()
    deadline = time.monotonic() + 60
    while not (probe is not None and probe._connected) and time.monotonic() < deadline:
        time.sleep(0.02)
    print("ready", flush=True)
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.02)
    for i in range(LINES):
        print(f"line {i}", flush=True)
        time.sleep(0.005)
    while not probe.failed and time.monotonic() < deadline:
        time.sleep(0.05)
    parts_on = [name for name, part in probe.parts.by_name.items() if part.on]
    print(f"probe failed={probe.failed} parts_on={parts_on}", flush=True)
    print("END OF JOB", file=sys.stderr, flush=True)
    """
).replace("LINES", str(LINES))


def test_the_job_survives_a_killed_supervisor_and_keeps_its_output(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    go = tmp_path / "go"
    argv = [*TRAINMEDIC, "run", "--quiet", "--no-html", "--out", str(run_dir)]
    argv += ["--", sys.executable, "-c", JOB, str(go)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        assert proc.stdout.readline() == b"ready\n"
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
        go.touch()
        # The job's output still arrives, through to the end of the job.
        rest = proc.stdout.read()
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [b"line %d\n" % i for i in range(LINES)]
    assert rest.startswith(b"".join(lines)), rest[-200:]
    assert b"probe failed=True parts_on=[]" in rest
    assert err.endswith(b"END OF JOB\n"), err
    log = (run_dir / "stdout.log").read_bytes()
    assert log.startswith(b"ready\n" + b"".join(lines))
    assert b"probe failed=True parts_on=[]" in log
    assert (run_dir / "stderr.log").read_bytes() == b"END OF JOB\n"
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    lost = [e for e in events if e["kind"] == "supervisor_lost"]
    assert len(lost) == 1, events
    assert not (run_dir / "probe.sock").exists()

    # The record of the unfinished run reads back, and a rerun into the same
    # directory says what the directory holds.
    shown = trainmedic("report", str(run_dir))
    assert shown.returncode == 0, shown.stderr
    again = trainmedic("run", "--out", str(run_dir), "--", sys.executable, "-c", "pass")
    line = assert_one_line_error(again)
    assert "earlier run" in line
    fresh = trainmedic(
        "run", "-q", "--no-html", "--out", str(tmp_path / "fresh"), "--",
        sys.executable, "-c", "print('fresh')",
    )
    assert fresh.returncode == 0, fresh.stderr
    assert fresh.stdout == b"fresh\n"


def test_no_probe_drops_a_dead_supervisor_s_probe_variables(tmp_path: Path) -> None:
    # A shell started under an earlier trainmedic keeps its probe variables;
    # a later `run --no-probe` must not hand them (and a stale socket) on.
    from trainmedic.probe import BOOTSTRAP_DIR
    from trainmedic.probe import env as probe_env

    env = dict(os.environ)
    env["PYTHONPATH"] = str(BOOTSTRAP_DIR)
    env[probe_env.ADDR] = f"unix:{tmp_path / 'gone' / 'probe.sock'}"
    env[probe_env.TOKEN] = "0" * 32
    code = (
        "import os; print(os.environ.get('TRAINMEDIC_PROBE_ADDR'), "
        "os.environ.get('TRAINMEDIC_PROBE_TOKEN'), os.environ.get('PYTHONPATH'))"
    )
    got = trainmedic(
        "run", "-q", "--no-html", "--no-probe", "--out", str(tmp_path / "run"), "--",
        sys.executable, "-c", code, env=env,
    )
    assert got.returncode == 0, got.stderr
    assert got.stdout == b"None None None\n"


@pytest.mark.parametrize("sig", [signal.SIGKILL])
def test_a_supervisor_killed_before_the_job_starts_leaves_no_keeper(
    tmp_path: Path, sig: int
) -> None:
    # Killed while the job runs a moment: the keeper exits when the job's output ends.
    argv = [*TRAINMEDIC, "run", "-q", "--no-html", "--out", str(tmp_path / "run"), "--"]
    argv += [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(1)"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"up\n"
    os.kill(proc.pid, sig)
    proc.wait(30)
    start = time.monotonic()
    assert proc.stdout.read() == b""  # EOF: nobody holds the pipe once the job ended
    assert time.monotonic() - start < 30
