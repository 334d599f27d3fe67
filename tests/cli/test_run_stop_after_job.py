"""SIGTERM, SIGHUP or Ctrl-C after the job ended, while the report is made: the report is
abandoned with one line, and ``trainmedic run`` exits with the job's status - never 143
or 129 with the job's 7 lost."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from trainmedic.cli import run_cmd
from trainmedic.supervise import session
from trainmedic.supervise.loop.attempt_setup import ResilienceOptions
from trainmedic.supervise.rundir import LOCK_FILE


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_stop_during_the_report_keeps_the_jobs_exit_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    signum: int,
) -> None:  # fmt: skip
    run_dir = tmp_path / "run"

    class Session:  # the job ran and exited 7
        def __init__(self, options: Any, **_: Any) -> None:
            self.options = options

        def run(self) -> Any:
            return SimpleNamespace(exit_status=7, record_loss=None)

    reached = []

    def report(*_: Any, **__: Any) -> None:
        reached.append(True)
        os.kill(os.getpid(), signum)
        time.sleep(30)  # interrupted by the handler's exception; 30 s only if it fails
        raise AssertionError("the signal did not stop the report")

    monkeypatch.setattr(session, "RunSession", Session)
    monkeypatch.setattr(run_cmd, "_diagnose_and_report", report)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
    code = run_cmd._run(
        ("python", "train.py"), run_dir, None, True, True, False, "never", None, {},
        ResilienceOptions(), None,
    )  # fmt: skip
    assert reached and code == 7
    err = capsys.readouterr().err
    name = signal.Signals(signum).name
    said = f"stopped by {name}" if signum != signal.SIGINT else "interrupted"
    assert f"trainmedic: {said}: the report was not finished; the job's exit status 7" in err
    assert f"trainmedic report {run_dir}" in err
    # The handlers are trainmedic's only while it reports; the directory is given up.
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before
    assert not (run_dir / LOCK_FILE).exists()
