"""The bootstrap: the probe loads in any Python process of the job, and nothing else changes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from trainmedic.channel.wire import Goodbye, Hello
from trainmedic.probe import BOOTSTRAP_DIR

from .probed import run_probed

REPORT = (
    "import json, sys; print(json.dumps({"
    "'torch': 'torch' in sys.modules, "
    "'trainmedic': 'trainmedic' in sys.modules, "
    f"'bootstrap_on_path': any(p.rstrip('/') == {str(BOOTSTRAP_DIR)!r} for p in sys.path), "
    "'pythonpath': __import__('os').environ.get('PYTHONPATH')}))"
)


def test_a_plain_python_process_says_hello_and_goodbye_without_torch(tmp_path: Path) -> None:
    # A step through the API gives the probe something to say, however short the process.
    run = run_probed(
        [sys.executable, "-c", "import trainmedic; trainmedic.step(); " + REPORT], tmp_path
    )
    assert run.proc.returncode == 0, run.proc.stderr
    seen = json.loads(run.proc.stdout)
    assert seen["torch"] is False  # the probe never imports torch itself
    assert seen["trainmedic"] is True
    assert seen["bootstrap_on_path"] is False  # the job's sys.path is as without us
    assert isinstance(run.messages[0], Hello)
    assert run.hellos[0].role == "process"
    assert [s.source for s in run.steps] == ["api"]
    assert isinstance(run.messages[-1], Goodbye)
    assert run.problems == []


def test_a_short_process_with_nothing_to_say_sends_nothing(tmp_path: Path) -> None:
    run = run_probed([sys.executable, "-c", "print('quick')"], tmp_path)
    assert run.proc.stdout == "quick\n"
    assert run.messages == []  # not even a connection: helper processes stay cheap
    assert run.problems == []


def test_existing_pythonpath_and_a_user_sitecustomize_keep_working(tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import builtins\nbuiltins.USER_SITE_RAN = 'yes'\n")
    (user / "helper_mod.py").write_text("VALUE = 7\n")
    code = (
        "import builtins, sys, helper_mod, trainmedic; trainmedic.step(); "
        "print(builtins.USER_SITE_RAN, helper_mod.VALUE, sys.modules['sitecustomize'].__file__)"
    )
    env = dict(os.environ, PYTHONPATH=str(user))
    run = run_probed([sys.executable, "-c", code], tmp_path, base_env=env)
    assert run.proc.returncode == 0, run.proc.stderr
    ran, value, site_file = run.proc.stdout.split()
    assert (ran, value) == ("yes", "7")
    assert Path(site_file) == user / "sitecustomize.py"
    assert run.hellos, "the probe loaded as well"


def test_a_failing_user_sitecustomize_fails_as_it_would_without_trainmedic(tmp_path: Path) -> None:
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("raise ValueError('broken site')\n")
    code = "print('job ran')"
    plain = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=str(user)),
        capture_output=True,
        text=True,
        check=False,
    )
    run = run_probed(
        [sys.executable, "-c", code], tmp_path, base_env=dict(os.environ, PYTHONPATH=str(user))
    )
    assert (run.proc.returncode, run.proc.stdout, run.proc.stderr) == (
        plain.returncode,
        plain.stdout,
        plain.stderr,
    )
    assert "Error in sitecustomize" in plain.stderr


def test_without_the_supervisors_variables_the_probe_stays_off(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINMEDIC_")}
    env["PYTHONPATH"] = str(BOOTSTRAP_DIR)
    out = subprocess.run(
        [sys.executable, "-c", REPORT], env=env, capture_output=True, text=True, check=True
    )
    seen = json.loads(out.stdout)
    assert seen["trainmedic"] is False


def test_a_probe_that_cannot_load_leaves_a_note_and_the_job_runs(tmp_path: Path) -> None:
    home = tmp_path / "home"
    (home / "trainmedic").mkdir(parents=True)
    (home / "trainmedic" / "__init__.py").write_text("raise ImportError('probe package broken')\n")
    run = run_probed(
        [sys.executable, "-c", "print('job ran')"],
        tmp_path,
        extra_env={"TRAINMEDIC_PROBE_HOME": str(home)},
    )
    assert run.proc.returncode == 0
    assert run.proc.stdout == "job ran\n"
    assert run.proc.stderr == ""
    note = (tmp_path / "bootstrap-errors.log").read_text()
    assert "probe package broken" in note


def test_the_api_is_a_cheap_no_op_outside_a_run() -> None:
    code = (
        "import sys, trainmedic\n"
        "trainmedic.step()\n"
        "with trainmedic.phase('eval'):\n"
        "    pass\n"
        "print('torch' in sys.modules, 'trainmedic.probe.runtime' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINMEDIC_")}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["False", "False"]


def test_an_uncaught_exception_is_recorded_and_printed_as_usual(tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text("def main():\n    return 1 / 0\n\nmain()\n")
    plain = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=False
    )
    run = run_probed([sys.executable, str(script)], tmp_path)
    assert run.proc.returncode == plain.returncode == 1
    assert run.proc.stderr == plain.stderr
    (event,) = [e for e in run.events if e.kind == "exception"]
    assert event.message == "ZeroDivisionError: division by zero"
    assert "return 1 / 0" in event.data["traceback"]
    pid = run.hellos[0].pid
    error_file = json.loads((tmp_path / "errors" / f"error-{pid}.json").read_text())
    assert error_file["message"]["message"] == "ZeroDivisionError: division by zero"
    assert "py_callstack" in error_file["message"]["extraInfo"]
    assert oct((tmp_path / "errors" / f"error-{pid}.json").stat().st_mode & 0o777) == "0o600"
