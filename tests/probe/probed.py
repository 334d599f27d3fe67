"""Run real child processes under a probe talking to an in-test channel server."""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trainmedic.channel.server import ChannelServer
from trainmedic.channel.wire import Goodbye, Hello, ProbeMessage
from trainmedic.record.types import LoaderActivity, LoaderInfo, RunEvent, StepRecord
from trainmedic.supervise.launch.launcher import probe_environment

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


@dataclass
class ProbedRun:
    """What a child process printed and what its probes sent."""

    proc: subprocess.CompletedProcess[str]
    messages: list[ProbeMessage] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def of(self, kind: type) -> list:  # type: ignore[type-arg]
        return [m for m in self.messages if isinstance(m, kind)]

    @property
    def steps(self) -> list[StepRecord]:
        return self.of(StepRecord)

    @property
    def hellos(self) -> list[Hello]:
        return self.of(Hello)

    @property
    def events(self) -> list[RunEvent]:
        return self.of(RunEvent)

    @property
    def loaders(self) -> list[LoaderInfo]:
        return self.of(LoaderInfo)

    @property
    def activity(self) -> list[LoaderActivity]:
        return self.of(LoaderActivity)

    @property
    def goodbyes(self) -> list[Goodbye]:
        return self.of(Goodbye)


def run_probed(
    argv: Sequence[str],
    run_dir: Path,
    extra_env: Mapping[str, str] | None = None,
    base_env: Mapping[str, str] | None = None,
    timeout: float = 120,
) -> ProbedRun:
    """Run ``argv`` with the probe loaded (as ``trainmedic run`` would), collecting messages."""
    result = ProbedRun(proc=subprocess.CompletedProcess(list(argv), 0))
    lock = threading.Lock()

    def add(message: ProbeMessage) -> None:
        with lock:
            result.messages.append(message)

    server = ChannelServer(run_dir, "test-token", add, result.problems.append)
    server.start()
    try:
        base = dict(os.environ if base_env is None else base_env)
        base.pop("PYTHONPATH", None) if base_env is None else None
        env = probe_environment(base, server.address, "test-token", run_dir)
        env.update(extra_env or {})
        result.proc = subprocess.run(
            list(argv), env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        server.wait_idle(10)
    finally:
        server.close()
    return result
