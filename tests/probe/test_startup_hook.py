"""The start-up hook: the probe loads even when a launch script replaces PYTHONPATH.

``trainmedic-probe.pth`` is installed into site-packages with the package (the
editable install ``scripts/setup`` makes, and a wheel); Python runs it at every
start-up of an interpreter of that environment. These tests run real child
processes of this environment's interpreter with the supervisor's variables
and a ``PYTHONPATH`` that no longer holds the bootstrap directory.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

import trainmedic
from trainmedic.probe import BOOTSTRAP_DIR
from trainmedic.probe import env as probe_env

from .probed import run_probed

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "src" / "trainmedic-probe.pth"

LOADED = (
    "import json, sys, threading, trainmedic; trainmedic.step(); print(json.dumps({"
    "'runtimes': sorted(n for n in sys.modules if n.endswith('probe.runtime')), "
    "'trainmedic_file': sys.modules['trainmedic'].__file__, "
    "'agents': sum(t.name == 'trainmedic-probe' for t in threading.enumerate()), "
    "'start_module': '_trainmedic_probe_start' in sys.modules, "
    "'path': sys.path}))"
)


def _installed_hook() -> Path:
    paths = {sysconfig.get_paths()["purelib"], *site.getsitepackages()}
    for directory in sorted(paths):
        candidate = Path(directory) / HOOK.name
        if candidate.is_file():
            return candidate
    pytest.fail(f"{HOOK.name} is not installed in {sorted(paths)}: run scripts/setup again")


def test_the_installed_hook_is_the_one_in_the_sources() -> None:
    assert _installed_hook().read_text() == HOOK.read_text()
    # One line, an import line: site.py executes it, and it must be cheap when idle.
    assert HOOK.read_text().count("\n") == 1 and HOOK.read_text().startswith("import ")


def test_without_a_run_the_hook_loads_nothing() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINMEDIC_")}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; print(sorted(m for m in sys.modules if 'trainmedic' in m))",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("replaced", ["/opt/project", ""])
def test_a_replaced_pythonpath_still_loads_the_probe(tmp_path: Path, replaced: str) -> None:
    # What `export PYTHONPATH=/opt/project; python train.py` does to the supervisor's path.
    run = run_probed([sys.executable, "-c", LOADED], tmp_path, extra_env={"PYTHONPATH": replaced})
    assert run.proc.returncode == 0, run.proc.stderr
    seen = json.loads(run.proc.stdout)
    assert seen["runtimes"] == ["trainmedic.probe.runtime"]
    assert seen["agents"] == 1
    assert seen["start_module"] is False  # loaded without a name in the job's modules
    assert str(BOOTSTRAP_DIR) not in seen["path"]
    assert [h.role for h in run.hellos] == ["process"]
    assert [s.source for s in run.steps] == ["api"]
    assert not (tmp_path / probe_env.BOOTSTRAP_ERRORS).exists()


def test_both_routes_at_once_load_one_probe(tmp_path: Path) -> None:
    # PYTHONPATH keeps the bootstrap and the .pth runs too: the first starts the probe,
    # the second finds it running.
    run = run_probed([sys.executable, "-c", LOADED], tmp_path)
    assert run.proc.returncode == 0, run.proc.stderr
    seen = json.loads(run.proc.stdout)
    assert seen["runtimes"] == ["trainmedic.probe.runtime"]
    assert seen["agents"] == 1
    assert (
        Path(seen["trainmedic_file"]).resolve().parent == Path(trainmedic.__file__).resolve().parent
    )
    assert len(run.hellos) == 1
    assert len(run.steps) == 1


def test_isolated_mode_ignores_pythonpath_but_not_the_hook(tmp_path: Path) -> None:
    run = run_probed([sys.executable, "-I", "-c", LOADED], tmp_path)
    assert run.proc.returncode == 0, run.proc.stderr
    assert json.loads(run.proc.stdout)["agents"] == 1
    assert len(run.hellos) == 1


def test_a_supervisor_without_the_hook_file_leaves_the_job_untouched(tmp_path: Path) -> None:
    # TRAINMEDIC_PROBE_HOME names a trainmedic without the start module (another version).
    fake_home = tmp_path / "home"
    (fake_home / "trainmedic").mkdir(parents=True)
    run = run_probed(
        [sys.executable, "-c", "print('ran')"],
        tmp_path,
        extra_env={"PYTHONPATH": "", probe_env.HOME: str(fake_home)},
    )
    # No bootstrap there: the job runs untouched and nothing breaks.
    assert run.proc.returncode == 0, run.proc.stderr
    assert run.proc.stdout == "ran\n"
    assert run.hellos == []


@pytest.mark.slow
def test_a_wheel_install_carries_the_hook(tmp_path: Path) -> None:
    """Build the wheel, install it into a bare environment (a wheel install is an unzip),
    and run that environment's interpreter with a replaced PYTHONPATH."""
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(dist), str(ROOT)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = dist.glob("trainmedic-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read(HOOK.name).decode() == HOOK.read_text()
        env_dir = tmp_path / "env"
        venv.EnvBuilder(with_pip=False, symlinks=True).create(env_dir)
        purelib = subprocess.run(
            [str(env_dir / "bin" / "python"), "-c",
             "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        zf.extractall(purelib)
    python = str(env_dir / "bin" / "python")
    run = run_probed(
        [python, "-c", "import trainmedic; trainmedic.step(); print('ok')"],
        tmp_path,
        extra_env={"PYTHONPATH": "/opt/project"},
    )
    assert run.proc.returncode == 0, run.proc.stderr
    assert run.proc.stdout == "ok\n"
    assert [h.role for h in run.hellos] == ["process"]
    assert [s.source for s in run.steps] == ["api"]
