"""Native stacks of a hung job with py-spy (the ``native`` extra; ``dev`` installs it).

A job blocked in C code holding the GIL runs no Python code at all, not even the
probe's thread: only faulthandler's C-level dump and py-spy, which reads the
process from outside, can say where it is. py-spy also names the C frames.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from resilience_helpers import faulty, left_running, run_trainmedic

from trainmedic.supervise.hang.forensics import find_py_spy

FAST = ["--timeout", "1", "--backoff", "0", "--grace", "1"]

pytestmark = pytest.mark.skipif(
    find_py_spy() is None, reason="py-spy is not installed (pip install 'trainmedic[native]')"
)


def test_a_job_blocked_in_c_code_gets_its_native_frames_saved(tmp_path: Path) -> None:
    state = tmp_path / "state"
    run = run_trainmedic(tmp_path, [*FAST, "--max-restarts", "1"], faulty(state, "cblock"))
    assert run.returncode == 0, run.stderr
    assert run.classes == ["hang", "success"]
    attempt = run.run_dir / "attempts" / "1"
    saved = json.loads((attempt / "hang.json").read_text())
    refused = [n for n in saved["notes"] if n.startswith("py-spy could not read")]
    if refused:  # a container without CAP_SYS_PTRACE: py-spy may not attach
        pytest.skip(refused[0])
    lead = saved["processes"][0]["pid"]
    name = f"py-spy-{lead}.txt"
    assert name in saved["files"]
    dump = (attempt / name).read_text()
    # The C frames the job is blocked in, below the Python frame that called them.
    assert "pthread_mutex_lock" in dump or "lll_lock_wait" in dump, dump
    assert "faulty.py" in dump
    assert (attempt / name).stat().st_mode & 0o077 == 0  # private, like every run file
    assert left_running(run.pids) == []
