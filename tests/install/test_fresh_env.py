"""A real environment made without torch: pip resolves no torch, and doctor and run work.

These install trainmedic from this checkout into new virtual environments with
pip as users do, so pip uses the package sources this machine is configured with
(``pip config list``: on the development machines a local index and wheel
directory, no network needed), exactly as ``scripts/setup`` does.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import venv
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# torch, its GPU stack and numpy: none may come with a plain install.
HEAVY = re.compile(r"^(torch|triton|numpy|nvidia-(?!ml-py$).*|cuda-.*)$")


def _pip_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _make_venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True, symlinks=True).create(path)
    return path / "bin" / "python"


def _names(report: dict[str, object]) -> list[str]:
    install = report["install"]
    assert isinstance(install, list)
    return [re.sub(r"[-_.]+", "-", item["metadata"]["name"]).lower() for item in install]


def test_a_dry_run_install_resolves_no_torch(tmp_path: Path) -> None:
    python = _make_venv(tmp_path / "venv")
    report_file = tmp_path / "report.json"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
         "--report", str(report_file), str(ROOT)],
        check=True, env=_pip_env(), timeout=600, capture_output=True,
    )  # fmt: skip
    names = _names(json.loads(report_file.read_text()))
    assert "trainmedic" in names and "psutil" in names and "nvidia-ml-py" in names
    assert [n for n in names if HEAVY.match(n)] == []


def test_the_demo_extra_brings_torch_and_numpy(tmp_path: Path) -> None:
    python = _make_venv(tmp_path / "venv")
    report_file = tmp_path / "report.json"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
         "--report", str(report_file), f"{ROOT}[demo]"],
        check=True, env=_pip_env(), timeout=600, capture_output=True,
    )  # fmt: skip
    names = _names(json.loads(report_file.read_text()))
    assert "torch" in names and "numpy" in names


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment with trainmedic and its core dependencies only."""
    root = tmp_path_factory.mktemp("bare")
    python = _make_venv(root / "venv")
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(ROOT)],
        check=True, env=_pip_env(), timeout=900, capture_output=True,
    )  # fmt: skip
    return root / "venv" / "bin"


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=300, cwd=cwd, env=_pip_env(), check=False
    )


def test_the_environment_has_no_torch(bare: Path, tmp_path: Path) -> None:
    result = _run([str(bare / "python"), "-c", "import torch"], tmp_path)
    assert result.returncode != 0 and "No module named 'torch'" in result.stderr
    result = _run([str(bare / "python"), "-c", "import numpy"], tmp_path)
    assert result.returncode != 0


def test_doctor_without_torch(bare: Path, tmp_path: Path) -> None:
    result = _run([str(bare / "trainmedic"), "doctor", "--json"], tmp_path)
    assert result.returncode in (0, 1), result.stderr
    assert "Traceback" not in result.stderr
    assert json.loads(result.stdout)["findings"] is not None


def test_run_without_torch(bare: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = _run(
        [str(bare / "trainmedic"), "run", "--quiet", "--out", str(out), "--",
         "python3", "-c", "print(1)"],
        tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "1"
    assert "Traceback" not in result.stderr
    assert json.loads((out / "findings.json").read_text())["findings"]

    script = tmp_path / "train.sh"
    script.write_text(f"#!/bin/sh\n{bare / 'python'} -c 'print(6 * 7)'\nexit 4\n")
    script.chmod(0o755)
    out = tmp_path / "script"
    result = _run([str(bare / "trainmedic"), "run", "--quiet", "--out", str(out), "--",
                   str(script)], tmp_path)  # fmt: skip
    assert result.returncode == 4, result.stderr
    assert result.stdout.strip() == "42"
    assert "Traceback" not in result.stderr
    assert (out / "findings.json").is_file()


def test_demo_without_torch_names_the_extra(bare: Path, tmp_path: Path) -> None:
    result = _run([str(bare / "trainmedic"), "demo", "--quiet"], tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "needs torch and numpy" in lines[0]
    assert "pip install 'trainmedic[demo]'" in lines[0]


def test_the_trace_demo_runs_from_an_installed_package_without_torch(
    bare: Path, tmp_path: Path
) -> None:
    # The bundled trace and its licence notice are package data of the installed wheel.
    result = _run([str(bare / "trainmedic"), "demo", "--scenario", "gpu-trace", "--quiet"],
                  tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "gpu.exposed_communication" in result.stdout and "as expected" in result.stderr
    notice = _run([str(bare / "python"), "-c", "from trainmedic.demo.traces import DEMO_TRACE;"
                   "print((DEMO_TRACE.parent / 'NOTICE.md').read_text())"], tmp_path)  # fmt: skip
    assert "MIT License" in notice.stdout
