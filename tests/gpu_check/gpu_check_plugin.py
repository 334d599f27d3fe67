"""The pytest plugin of ``scripts/gpu-check``: each test's result kept as it ends, and a
per-test time limit without pytest-timeout (which the GPU machine does not have).

Loaded with ``-p gpu_check_plugin`` (this directory on ``PYTHONPATH``):

- ``--gpu-check-out DIR`` / ``--gpu-check-part NAME``: a line per test as it
  starts and as it ends (``gpu_check_results``: flushed, fsynced, the summary
  rendered anew), and one per test file that could not be collected or was
  skipped whole.
- ``--gpu-check-timeout SECONDS``: a SIGALRM fails the test that runs past it
  (setup, call and teardown together) and the session goes on. Past its limit
  a test gets ``--gpu-check-grace`` seconds more, for its teardown (at most
  ``TEARDOWN_MIN_S`` of them) and to get back to Python: one stuck where
  Python cannot run the handler (inside a C call that never returns) is then
  ended by faulthandler, which writes every thread's stack to
  ``DIR/gpu-check-hang.txt`` and exits pytest. Its line stays "started",
  which the summary shows as KILLED.
"""

from __future__ import annotations

import faulthandler
import signal
import tempfile
import time
from collections.abc import Generator
from pathlib import Path
from typing import IO, Any

import pytest
from gpu_check_results import (
    ERROR,
    FAILED,
    PASSED,
    SKIPPED,
    TIMEOUT,
    XFAILED,
    XPASSED,
    append_line,
)

HANG_FILE = "gpu-check-hang.txt"
TEARDOWN_MIN_S = 10.0  # a test past its limit still gets this long (within the grace) to clean up
DETAIL_CHARS = 6000  # of a failure's text, kept for the JUnit file


class GpuCheckTimeLimit(BaseException):
    """A test ran past gpu-check's per-test limit.

    A BaseException, so that code under test that turns an ``Exception`` into
    one line cannot swallow it; pytest still reports it as the test's failure.
    """


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gpu-check", "scripts/gpu-check's results and per-test limit")
    group.addoption("--gpu-check-out", metavar="DIR", help="keep each test's result here")
    group.addoption("--gpu-check-part", default="tests", help="the part of gpu-check these are")
    group.addoption(
        "--gpu-check-timeout", type=float, default=0.0, metavar="SECONDS",
        help="fail a test that runs longer than this (0: no limit)",
    )  # fmt: skip
    group.addoption(
        "--gpu-check-grace", type=float, default=30.0, metavar="SECONDS",
        help="a test still running this long past its limit ends pytest",
    )  # fmt: skip


def pytest_configure(config: pytest.Config) -> None:
    out = config.getoption("--gpu-check-out")
    limit = config.getoption("--gpu-check-timeout")
    if out is None and not limit:
        return
    recorder = GpuCheckRecorder(
        Path(out) if out else None,
        config.getoption("--gpu-check-part"),
        limit,
        config.getoption("--gpu-check-grace"),
    )
    config.pluginmanager.register(recorder, "gpu_check_recorder")
    config.add_cleanup(recorder.close)


class GpuCheckRecorder:
    """Writes each test's start and end to the results file, and enforces the time limit."""

    def __init__(self, out_dir: Path | None, part: str, limit_s: float, grace_s: float) -> None:
        self.out_dir, self.part = out_dir, part
        self.limit_s, self.grace_s = limit_s, grace_s
        self.deadline: float | None = None
        self.armed = False
        self.current: dict[str, Any] = {}
        self.hang_file: IO[str] | None = None
        if limit_s:
            # faulthandler writes from its own thread, past pytest's capture.
            hang_dir = out_dir or Path(tempfile.gettempdir())
            hang_dir.mkdir(parents=True, exist_ok=True)
            self.hang_file = open(hang_dir / HANG_FILE, "a", encoding="utf-8")  # noqa: SIM115
            signal.signal(signal.SIGALRM, self._on_alarm)

    def close(self) -> None:
        if self.hang_file is not None:
            faulthandler.cancel_dump_traceback_later()
            self.hang_file.close()
            self.hang_file = None

    def _line(self, **fields: Any) -> None:
        if self.out_dir is not None:
            append_line(self.out_dir, {"part": self.part, **fields})

    # --- the limit: one deadline per test, each phase armed with what is left of it

    def _on_alarm(self, signum: int, frame: Any) -> None:
        if self.armed:
            self.armed = False
            raise GpuCheckTimeLimit(f"ran past gpu-check's per-test limit of {self.limit_s:g} s")

    def _phase(self, floor_s: float) -> Generator[None, Any, Any]:
        if self.deadline is None:
            return (yield)
        self.armed = True
        signal.setitimer(signal.ITIMER_REAL, max(floor_s, self.deadline - time.monotonic()))
        try:
            return (yield)
        finally:
            self.armed = False
            signal.setitimer(signal.ITIMER_REAL, 0)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self._phase(0.01))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self._phase(0.01))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self._phase(min(TEARDOWN_MIN_S, self.grace_s)))

    # --- the results

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        self.current = {"result": PASSED, "why": "", "detail": ""}
        self._line(kind="test", event="start", test=nodeid)
        started = time.monotonic()
        self.current["started"] = started
        if self.limit_s:
            self.deadline = started + self.limit_s
            faulthandler.dump_traceback_later(
                self.limit_s + self.grace_s, exit=True, file=self.hang_file
            )

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        result, why = outcome(report)
        if result is None:
            return
        if result == FAILED and report.when != "call":
            result = ERROR  # a fixture failed, not the test
        if "GpuCheckTimeLimit" in report.longreprtext:
            result = TIMEOUT
        # The first failure says why; a later phase's does not replace it.
        if self.current.get("result") in (PASSED, XFAILED):
            self.current.update(result=result, why=why)
            if result in (FAILED, ERROR, TIMEOUT, XPASSED):
                self.current["detail"] = report.longreprtext[-DETAIL_CHARS:]

    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        if self.limit_s:
            faulthandler.cancel_dump_traceback_later()
            self.deadline = None
        started = self.current.pop("started", time.monotonic())
        seconds = round(time.monotonic() - started, 2)
        self._line(kind="test", event="end", test=nodeid, seconds=seconds, **self.current)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.passed or not report.nodeid:
            return
        result, why = outcome(report)
        self._line(
            kind="test", event="end", test=report.nodeid, seconds=None,
            result=ERROR if report.failed else result, why=why,
            detail=report.longreprtext[-DETAIL_CHARS:] if report.failed else "",
        )  # fmt: skip


def outcome(report: pytest.TestReport | pytest.CollectReport) -> tuple[str | None, str]:
    """The result a report gives (``None``: nothing to note) and why, in one line."""
    xfail = getattr(report, "wasxfail", None)
    if report.skipped:
        if xfail is not None:
            return XFAILED, f"xfail: {xfail}" if xfail else "xfail"
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else longrepr
        return SKIPPED, str(reason).removeprefix("Skipped: ")
    if report.failed:
        return FAILED, first_error_line(report.longreprtext)
    if xfail is not None:
        return XPASSED, "passed, but it is marked xfail"
    return None, ""


def first_error_line(text: str) -> str:
    """The exception's own line of a pytest failure text (``E   AssertionError: ...``)."""
    lines = text.splitlines()
    for line in lines:
        if line.startswith("E   "):
            return line[4:].strip()
    return next((ln.strip() for ln in reversed(lines) if ln.strip()), "")
