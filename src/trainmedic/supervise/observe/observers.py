"""What watches the job besides the channel: the GPU, Xid and host samplers,
the live view, and the host facts read once in the background.

Each observer is optional: one that fails to start becomes a
``sampler_error`` event and the run goes on without it (the job is already
running and must stay supervised).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Sequence

from trainmedic.gpu.backend import GpuBackend
from trainmedic.gpu.types import GpuSample
from trainmedic.host.types import HostFacts
from trainmedic.record.events import EventKind
from trainmedic.record.types import RunEvent
from trainmedic.simulation import Simulation
from trainmedic.supervise.live.status import LiveAggregate
from trainmedic.supervise.live.view import LiveView
from trainmedic.supervise.loop.attempt_setup import CurrentJob
from trainmedic.supervise.observe.census import ProcessCensus
from trainmedic.supervise.observe.processes import MessageRouter, ProcessTable
from trainmedic.supervise.observe.samplers import GpuSampler, HostSampler, SamplerThread
from trainmedic.supervise.observe.threads import ROLE_TRAIN, ROLE_WORKER, ThreadSampler
from trainmedic.supervise.observe.xid_watch import XidWatcher
from trainmedic.supervise.output.stream import TerminalMux


class FactsGatherer(threading.Thread):
    """Reads the host once in the background while the job starts."""

    def __init__(self, simulation: Simulation | None) -> None:
        super().__init__(name="trainmedic-facts", daemon=True)
        self._simulation = simulation
        self.host: HostFacts | None = None
        self.error: str | None = None

    def run(self) -> None:
        if self._simulation is not None and self._simulation.host is not None:
            self.host = self._simulation.host
            return
        try:
            from trainmedic.host.gather import gather_host_facts

            self.host = gather_host_facts()
        except Exception as exc:  # facts only refine diagnosis; the run goes on
            self.error = f"{type(exc).__name__}: {exc}"


class Observers:
    """What watches the job besides the channel: samplers, the live view, the host facts.

    Each is optional: one that fails to start becomes an event, and the run
    goes on without it (the job is already running and must stay supervised).
    """

    def __init__(
        self,
        job: CurrentJob,
        backend: GpuBackend,
        simulation: Simulation | None,
        router: MessageRouter,
        aggregate: LiveAggregate,
        mux: TerminalMux,
        mode: str,
        *,
        table: ProcessTable,
        wall: Callable[[], float],
        title: str,
        stderr_fd: int,
        helpers: Callable[[], Sequence[int]] | None = None,
    ) -> None:
        """``mode`` is the live view's (``panel``, ``plain``, ``off``); ``title``
        names the command in it; ``stderr_fd`` is the terminal whose width it fits;
        ``helpers`` gives the pids of trainmedic's own helper processes now (py-spy
        sampling the job), whose CPU is the supervisor's, not other tenants'."""
        self._wall = wall
        self._helpers = helpers
        self._router = router
        self.first_gpu: dict[int, GpuSample] = {}
        self.gpu_period_s: float | None = None
        self._gpu: GpuSampler | None = None
        self._xids: XidWatcher | None = None
        self._table = table
        self._stopped = False
        self.census = ProcessCensus(started_at=self._wall())
        self.samplers: list[SamplerThread] = []
        self.live: LiveView | None = None
        self.facts = FactsGatherer(simulation)
        self._guard("host facts", self.facts.start)
        self._guard("GPU sampling", lambda: self._start_gpu(backend))
        self._guard("Xid watch", lambda: self._start_xids(backend))
        self._guard("host sampling", lambda: self._start_host(job))
        self._guard("live view", lambda: self._start_live(aggregate, mux, mode, title, stderr_fd))

    def _guard(self, what: str, start: Callable[[], None]) -> None:
        try:
            start()
        except Exception as exc:
            self._router.add_event(_sampler_error(what, exc, self._wall()))

    def _record_gpu(self, sample: GpuSample) -> None:
        self.first_gpu.setdefault(sample.index, sample)
        self._router.add_gpu(sample)

    def _start_gpu(self, backend: GpuBackend) -> None:
        self._gpu = GpuSampler(backend, self._record_gpu, self._router.add_event)
        self._thread("gpu", "GPU", self._gpu.sample_once)

    def _start_xids(self, backend: GpuBackend) -> None:
        self._xids = XidWatcher(backend, self._router.add_event, lambda: dict(self.first_gpu))
        if self._xids.source is not None:
            self._thread("xid", "Xid watch", self._xids.sample_once)

    def _start_host(self, job: CurrentJob) -> None:
        host = HostSampler(
            job.pid,
            self._router.add_host,
            tree=job.descendants,
            cgroup_cpu=_cgroup_reader(job.pid),
            threads=ThreadSampler(lambda: _roles(self._table)),
            census=self.census,
            helpers=self._helpers,
        )
        self._thread("host", "host", host.sample_once)

    def _thread(self, name: str, what: str, sample_once: Callable[[], float]) -> None:
        thread = SamplerThread(
            name,
            sample_once,
            lambda e: self._router.add_event(_sampler_error(what, e, self._wall())),
        )
        thread.start()
        self.samplers.append(thread)

    def _start_live(
        self, aggregate: LiveAggregate, mux: TerminalMux, mode: str, title: str, stderr_fd: int
    ) -> None:
        self.live = LiveView(
            aggregate,
            mode,
            title,
            mux.show_panel,
            mux.status_line,
            mux.clear_panel,
            width=lambda: _terminal_width(stderr_fd),
            color_system=_color_system() if mode == "panel" else None,
        )
        self.live.start()

    def stop(self) -> None:
        """Stop watching; the first call does it, later ones do nothing."""
        if self._stopped:
            return
        self._stopped = True
        if self.live is not None:
            self.live.stop()
        for s in self.samplers:
            s.stop()
        if self._xids is not None:
            self._xids.close()
        if self._gpu is not None:
            self.gpu_period_s = self._gpu.period_s

    def host_facts(self) -> HostFacts | None:
        if self.facts.ident is not None:  # it may have failed to start
            self.facts.join(5.0)
        return self.facts.host


def _roles(table: ProcessTable) -> dict[int, str]:
    """What the probes said each process does: DataLoader worker, or training (it marks steps)."""
    roles: dict[int, str] = {}
    for pid, state in table.snapshot().items():
        if state.hello.role == "worker":
            roles[pid] = ROLE_WORKER
        elif state.trains or (state.last_heartbeat is not None and state.last_heartbeat.steps > 0):
            roles[pid] = ROLE_TRAIN
    return roles


def _sampler_error(what: str, exc: BaseException, t: float) -> RunEvent:
    return RunEvent(
        t=t,
        kind=EventKind.SAMPLER_ERROR,
        message=f"{what} stopped: {type(exc).__name__}: {exc}",
    )


def _cgroup_reader(pid: int) -> Callable[[], tuple[float | None, float | None]]:
    """(quota in cores, cumulative throttled seconds) of the job's CPU cgroup."""
    try:
        from trainmedic.host.cgroup import locate_cgroup, read_cpu

        location = locate_cgroup(pid=pid).cpu
    except Exception:
        location = None

    def read() -> tuple[float | None, float | None]:
        if location is None:
            return None, None
        try:
            cpu = read_cpu(location)
        except Exception:
            return None, None
        return cpu.quota_cores, cpu.throttled_s

    return read


def _terminal_width(fd: int) -> int:
    try:
        columns = os.get_terminal_size(fd).columns
    except OSError:
        columns = 0
    return columns or 80  # a new pty reports 0 columns until someone sizes it


def _color_system() -> str | None:
    from rich.console import Console

    return Console(file=sys.stderr).color_system
