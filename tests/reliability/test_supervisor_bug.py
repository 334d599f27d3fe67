"""A bug of the supervisor while the job runs costs the job nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent / "scripts"
JOB = (
    "import sys, time\n"
    "for i in range(8):\n"
    "    print(i, flush=True)\n"
    "    time.sleep(0.25)\n"
    "sys.exit(3)"
)


def test_a_supervisor_bug_mid_run_leaves_the_job_running_and_its_status(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    argv = [sys.executable, str(SCRIPTS / "buggy_supervisor_run.py"), "run", "--no-html"]
    argv += ["--out", str(run_dir), "--", sys.executable, "-c", JOB]
    got = subprocess.run(argv, capture_output=True, timeout=120, check=False)
    err = got.stderr.decode()
    assert got.returncode == 3, err
    assert got.stdout == b"".join(b"%d\n" % i for i in range(8))
    assert "Traceback" not in err
    notices = [line for line in err.splitlines() if "internal error" in line]
    assert len(notices) == 1 and "the job (pid" in notices[0], err
    events = [json.loads(x) for x in (run_dir / "events.jsonl").read_text().splitlines()]
    (bug,) = [e for e in events if e["kind"] == "supervisor_error"]
    assert "a bug in the supervisor" in bug["data"]["traceback"]
    assert json.loads((run_dir / "meta.json").read_text())["exit_code"] == 3
    assert (run_dir / "findings.json").is_file()
