"""A reader that goes away (``trainmedic run ... | head -2``) costs the job nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from trainmedic.findings.model import Category
from trainmedic.resilience.classify import FailureClass, FailureEvidence, classify_failure

from .helpers import TRAINMEDIC

LINES = 300

# Prints two lines, waits until the test has closed its end of the pipe, then
# prints the rest: every later line would hit the closed pipe without trainmedic.
JOB = textwrap.dedent(
    """
    import os, sys, time
    go = sys.argv[1]
    print("line 0", flush=True)
    print("line 1", flush=True)
    deadline = time.monotonic() + 60
    while not os.path.exists(go) and time.monotonic() < deadline:
        time.sleep(0.02)
    for i in range(2, LINES):
        print(f"line {i}", flush=True)
    print("END OF JOB", file=sys.stderr, flush=True)
    """
).replace("LINES", str(LINES))


@pytest.mark.parametrize("merged", [False, True], ids=["stdout", "stdout-and-stderr"])
def test_head_closes_the_pipe_and_the_job_runs_to_completion(
    tmp_path: Path, merged: bool
) -> None:
    run_dir = tmp_path / "run"
    go = tmp_path / "go"
    argv = [*TRAINMEDIC, "run", "--no-html", "--out", str(run_dir)]
    argv += ["--", sys.executable, "-c", JOB, str(go)]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merged else subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        head = [proc.stdout.readline() for _ in range(2)]
        proc.stdout.close()  # what `head -2` does after its two lines
        go.touch()
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            go.touch()  # the job's wait ends too
    assert head == [b"line 0\n", b"line 1\n"]
    assert proc.returncode == 0, err
    log = (run_dir / ("output.log" if merged else "stdout.log")).read_bytes()
    expected = b"".join(b"line %d\n" % i for i in range(LINES))
    if merged:
        assert log == expected + b"END OF JOB\n"
    else:
        assert log == expected
        assert (run_dir / "stderr.log").read_bytes() == b"END OF JOB\n"
    assert sorted(p.name for p in (run_dir / "attempts").iterdir()) == ["1"]
    assert json.loads((run_dir / "meta.json").read_text())["exit_code"] == 0
    assert b"Traceback" not in (err or b"")


BROKEN_PIPE = """\
    Traceback (most recent call last):
      File "/home/user/train.py", line 12, in <module>
        print(f"epoch {epoch} loss {loss:.3f}")
    BrokenPipeError: [Errno 32] Broken pipe
"""


@pytest.mark.parametrize(
    "stderr",
    [
        BROKEN_PIPE,
        BROKEN_PIPE.replace("BrokenPipeError: [Errno 32]", "OSError: [Errno 32]"),
    ],
)
def test_a_broken_pipe_in_the_job_is_not_a_distributed_error(stderr: str) -> None:
    c = classify_failure(FailureEvidence.from_stderr_text(1, textwrap.dedent(stderr).strip()))
    assert c.category is not Category.NETWORK
    assert "distributed" not in c.why
    assert c.failure_class is FailureClass.USER_EXCEPTION
    assert "pipe" in c.why


def test_a_lost_peer_is_still_a_distributed_error() -> None:
    stderr = """\
        Traceback (most recent call last):
          File "/home/user/train.py", line 40, in <module>
            dist.all_reduce(t)
        RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:4021
    """  # noqa: E501
    c = classify_failure(FailureEvidence.from_stderr_text(1, textwrap.dedent(stderr).strip()))
    assert c.category is Category.NETWORK


@pytest.mark.parametrize("fd", [0, 1, 2])
def test_a_closed_standard_descriptor_never_lands_in_the_record(tmp_path: Path, fd: int) -> None:
    # `trainmedic run ... >&-`: were fd 1 left closed, the first record file
    # opened would get it, and the job's output would be written into it.
    run_dir = tmp_path / "run"
    code = "import sys; print('out'); print('err', file=sys.stderr)"
    argv = [*TRAINMEDIC, "run", "-q", "--no-html", "--out", str(run_dir)]
    argv += ["--", sys.executable, "-c", code]
    got = subprocess.run(
        argv, capture_output=fd != 1, preexec_fn=lambda: os.close(fd), timeout=120, check=False
    )
    assert got.returncode == 0
    assert (run_dir / "stdout.log").read_bytes() == b"out\n"
    assert (run_dir / "stderr.log").read_bytes() == b"err\n"
    for name in ("steps.jsonl", "events.jsonl", "gpu.jsonl"):
        text = (run_dir / name).read_text()
        assert all(line.startswith("{") for line in text.splitlines()), (name, text)
    assert json.loads((run_dir / "findings.json").read_text())["tool"] == "run"
