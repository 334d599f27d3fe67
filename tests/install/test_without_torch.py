"""The supervisor, doctor and the reports need neither torch nor numpy.

Here, in this environment (which has both), the supervisor's interpreter is made
unable to import them; ``test_fresh_env.py`` (slow) checks a real environment
installed without them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).with_name("without_torch.py")


def _trainmedic(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        check=False,
    )


def test_no_module_outside_the_job_imports_torch_or_numpy(tmp_path: Path) -> None:
    result = _trainmedic("walk", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_doctor_runs_without_torch(tmp_path: Path) -> None:
    result = _trainmedic("doctor", "--json", cwd=tmp_path)
    assert result.returncode in (0, 1), result.stderr
    assert "Traceback" not in result.stderr
    document = json.loads(result.stdout)
    assert document["findings"] is not None


def test_run_supervises_python_and_a_shell_script_without_torch(tmp_path: Path) -> None:
    result = _trainmedic(
        "run", "--quiet", "--out", str(tmp_path / "py"), "--",
        sys.executable, "-c", "print('hello from the job')",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "hello from the job" in result.stdout
    assert (tmp_path / "py" / "findings.json").is_file()

    script = tmp_path / "job.sh"
    script.write_text('#!/bin/sh\necho "shell job $1"\nexit 7\n')
    script.chmod(0o755)
    result = _trainmedic("run", "--quiet", "--out", str(tmp_path / "sh"), "--", str(script), "x",
                         cwd=tmp_path)  # fmt: skip
    assert result.returncode == 7, result.stderr  # the job's exit status, unchanged
    assert "shell job x" in result.stdout
    assert (tmp_path / "sh" / "findings.json").is_file()


def test_demo_without_torch_says_what_to_install(tmp_path: Path) -> None:
    result = _trainmedic("demo", "--quiet", "--out", str(tmp_path / "d"), cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "torch and numpy" in lines[0]
    assert "pip install 'trainmedic[demo]'" in lines[0]
    assert not (tmp_path / "d").exists()
