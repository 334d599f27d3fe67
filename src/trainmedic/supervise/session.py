"""One supervised run, from launch to a closed run record.

:class:`RunSession` wires the parts of the supervisor together and runs them
as observe -> decide -> act: the launcher starts the job; the channel, the
samplers and the output pumps observe it into the run record and the live
view; signals become decisions of the :class:`SignalForwarder`; when the job
ends, the session winds everything down in an order that loses nothing
(output drained, leftovers stopped, probes' last messages read, record
closed) and returns a :class:`RunOutcome`. Diagnosis and reports are the
caller's (the ``run`` command).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainmedic import __version__
from trainmedic.channel.server import ChannelServer
from trainmedic.doctor.facts import GpuFacts, MachineFacts
from trainmedic.errors import RunDirectoryError
from trainmedic.framework.torch_build import TorchBuild, parse_cuda_version, read_torch_build
from trainmedic.gpu.backend import GpuBackend
from trainmedic.gpu.factory import open_nvml_or_none
from trainmedic.gpu.types import GpuSample
from trainmedic.host.types import HostFacts
from trainmedic.ostext import printable
from trainmedic.probe import env as probe_env
from trainmedic.record.guard import RecordGuard, RecordLoss, WriteFn
from trainmedic.record.store import META_FILE, RunRecordWriter
from trainmedic.record.types import RunEvent, RunMeta
from trainmedic.resilience.incidents import AttemptSummary
from trainmedic.simulation import Simulation, load_simulation
from trainmedic.supervise.attempts import (
    AttemptIO,
    AttemptLoop,
    CurrentJob,
    ResilienceOptions,
    StopRequests,
)
from trainmedic.supervise.census import ProcessCensus
from trainmedic.supervise.fallback import run_on_unsupervised
from trainmedic.supervise.keeper import OutputKeeper
from trainmedic.supervise.launcher import (
    become_subreaper,
    exit_status,
    forwarding_signals,
    probe_environment,
    same_destination,
)
from trainmedic.supervise.live import LiveAggregate, LiveView
from trainmedic.supervise.metrics import MetricsState
from trainmedic.supervise.output import TerminalMux
from trainmedic.supervise.processes import MessageRouter, ProcessTable
from trainmedic.supervise.rundir import command_name
from trainmedic.supervise.samplers import GpuSampler, HostSampler, SamplerThread
from trainmedic.supervise.threads import ROLE_TRAIN, ROLE_WORKER, ThreadSampler
from trainmedic.supervise.watchdog import Watchdog
from trainmedic.supervise.xid_watch import XidWatcher

STDOUT_LOG = "stdout.log"
STDERR_LOG = "stderr.log"
OUTPUT_LOG = "output.log"
"""Both streams, in the order written, when they share trainmedic's terminal or file."""
FLUSH_EVERY_S = 2.0
"""How often buffered record lines are pushed to the files (what a killed supervisor loses)."""


@dataclass(frozen=True)
class RunOptions:
    """What the user asked ``trainmedic run`` to do.

    Attributes:
        live: ``auto`` (a panel on a terminal, plain lines otherwise) or ``off``.
        probe: load the probe into the job's Python processes.
        created_dir: whether ``run_dir`` was created for this run (and may be
            removed again when the job cannot start).
        resilience: hang detection, restarts and resume (:mod:`.attempts`).
    """

    argv: tuple[str, ...]
    run_dir: Path
    simulate: str | None = None
    live: str = "auto"
    probe: bool = True
    cwd: str | None = None
    created_dir: bool = True
    resilience: ResilienceOptions = field(default_factory=ResilienceOptions)


@dataclass(frozen=True)
class RunOutcome:
    """How the run ended.

    Attributes:
        returncode: the job's raw return code (negative: killed by that signal).
        exit_status: what a shell would report (128 + signal when killed).
        machine: the machine's facts, for diagnosis.
        leftovers: pids the job left running that trainmedic stopped.
        attempts: every attempt of the job (one unless it was restarted).
        record_loss: what the record lost when the run directory stopped taking
            writes (a full disk), else ``None``.
    """

    run_dir: Path
    returncode: int
    exit_status: int
    started_at: float
    ended_at: float
    machine: MachineFacts | None
    leftovers: tuple[int, ...] = ()
    attempts: tuple[AttemptSummary, ...] = ()
    record_loss: RecordLoss | None = None


class _FactsGatherer(threading.Thread):
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


class _Observers:
    """What watches the job besides the channel: samplers, the live view, the host facts.

    Each is optional: one that fails to start becomes an event, and the run
    goes on without it (the job is already running and must stay supervised).
    """

    def __init__(
        self,
        session: RunSession,
        job: CurrentJob,
        backend: GpuBackend,
        simulation: Simulation | None,
        router: MessageRouter,
        aggregate: LiveAggregate,
        mux: TerminalMux,
        mode: str,
    ) -> None:
        self._wall = session.wall
        self._router = router
        self.first_gpu: dict[int, GpuSample] = {}
        self.gpu_period_s: float | None = None
        self._gpu: GpuSampler | None = None
        self._xids: XidWatcher | None = None
        self._table = session.table
        self.census = ProcessCensus(started_at=self._wall())
        self.samplers: list[SamplerThread] = []
        self.live: LiveView | None = None
        self.facts = _FactsGatherer(simulation)
        self._guard("host facts", self.facts.start)
        self._guard("GPU sampling", lambda: self._start_gpu(backend))
        self._guard("Xid watch", lambda: self._start_xids(backend))
        self._guard("host sampling", lambda: self._start_host(job))
        self._guard("live view", lambda: self._start_live(session, aggregate, mux, mode))

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
        self, session: RunSession, aggregate: LiveAggregate, mux: TerminalMux, mode: str
    ) -> None:
        self.live = LiveView(
            aggregate,
            mode,
            command_name(session.options.argv),
            mux.show_panel,
            mux.status_line,
            mux.clear_panel,
            width=lambda: _terminal_width(session.stderr_fd),
            color_system=_color_system() if mode == "panel" else None,
        )
        self.live.start()

    def stop(self) -> None:
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


class RunSession:
    """Runs one job under supervision; see the module docstring."""

    def __init__(
        self,
        options: RunOptions,
        environ: Mapping[str, str] | None = None,
        stdout_fd: int = 1,
        stderr_fd: int = 2,
        wall: Callable[[], float] = time.time,
        write: WriteFn = os.write,
        keep_output: bool = True,
        metrics: MetricsState | None = None,
    ) -> None:
        """``write`` is the seam every write into the run directory goes through
        (tests inject a full disk); ``keep_output`` starts the output keeper."""
        self.options = options
        self.guard = RecordGuard(write=write, wall=wall)
        self.keep_output = keep_output
        self.environ = dict(os.environ if environ is None else environ)
        self.stdout_fd = stdout_fd
        self.stderr_fd = stderr_fd
        self.wall = wall
        self.table = ProcessTable()
        self.metrics = metrics
        """The Prometheus exporter's state (``--prometheus``): one more record sink."""

    def _live_mode(self) -> str:
        if self.options.live == "off":
            return "off"
        if os.isatty(self.stderr_fd) and self.environ.get("TERM", "") != "dumb":
            return "panel"
        return "plain"

    def run(self) -> RunOutcome:
        """Run the job to its end; returns how it ended.

        Raises:
            CommandNotFoundError / CommandNotExecutableError: the job could not
                start (the run directory is removed again).
            SimulationFileError: a bad ``--simulate`` file.
            RunDirectoryError: the run directory cannot be written (nothing ran).
        """
        options = self.options
        run_dir = options.run_dir
        simulation = load_simulation(options.simulate) if options.simulate else None
        backend: GpuBackend = simulation.backend if simulation is not None else open_nvml_or_none()
        started_at = self.wall()
        cwd = options.cwd or os.getcwd()
        meta = RunMeta(
            run_id=printable(run_dir.name),
            command=tuple(printable(a) for a in options.argv),
            cwd=printable(cwd),
            started_at=started_at,
            trainmedic_version=__version__,
            gpu_backend=backend.kind,
        )
        aggregate = LiveAggregate(started_at)
        current: list[CurrentJob] = []
        watchdog = Watchdog(
            self.table, lambda: current[0].descendants() if current else [], wall=self.wall
        )
        token = secrets.token_hex(16)
        sinks: list[Any] = [aggregate, watchdog]
        if self.metrics is not None:
            self.metrics.warnings = lambda: aggregate.status(self.wall()).warnings
            sinks.append(self.metrics)
        writer, router, server = self._open_record(meta, sinks, token)
        mode = self._live_mode()
        mux = TerminalMux(self.stdout_fd, self.stderr_fd, panel=mode == "panel")
        env = probe_environment(self.environ, server.address, token, run_dir, probe=options.probe)
        become_subreaper()
        server.start()
        keeper = self._start_keeper(server, router)
        flusher = SamplerThread(
            "record-flush", lambda: _flush(writer, FLUSH_EVERY_S), lambda _e: None
        )
        flusher.start()
        merged = same_destination(self.stdout_fd, self.stderr_fd)
        logs = (
            ((self.stdout_fd, OUTPUT_LOG),)
            if merged
            else ((self.stdout_fd, STDOUT_LOG), (self.stderr_fd, STDERR_LOG))
        )
        # Signals are handled from before the job exists: a Ctrl-C while it starts
        # is delivered to it as soon as it does, never lost and never an orphan.
        forwarder = StopRequests(None, mux.notice)
        cpu0 = time.process_time()
        observers: list[_Observers] = []

        def start_observers(job: CurrentJob) -> None:
            current.append(job)
            observers.append(
                _Observers(self, job, backend, simulation, router, aggregate, mux, mode)
            )

        loop = AttemptLoop(
            argv=options.argv,
            cwd=options.cwd,
            env=env,
            run_dir=run_dir,
            options=options.resilience,
            io=AttemptIO(
                self.stdout_fd,
                self.stderr_fd,
                merged,
                mux,
                logs,
                record_guard=self.guard,
                keeper=keeper,
            ),
            router_event=router.add_event,
            watchdog=watchdog,
            stops=forwarder,
            wait_idle=server.wait_idle,
            start_observers=start_observers,
            gpu_backend_kind=backend.kind,
            wall=self.wall,
        )
        with forwarding_signals(forwarder, on_resize=lambda: forwarder.resize(self.stdout_fd)):
            try:
                try:
                    result = loop.run()
                except Exception as exc:
                    if loop.current is None:
                        raise
                    # A bug of the supervisor must not cost the job its run or its
                    # exit status: supervision stops, the job runs on to its end.
                    result = run_on_unsupervised(
                        loop, exc, mux.notice, router.add_event, self.wall
                    )
            except BaseException:
                for o in observers:
                    o.stop()
                flusher.stop()
                server.close()
                writer.close()
                backend.close()
                if not observers:
                    if keeper is not None:
                        keeper.close()  # nothing ran: nothing to take over
                    _discard(run_dir, remove_dir=options.created_dir)
                raise
            for o in observers:
                o.stop()
                router.add_event(o.census.event(self.wall(), probe=options.probe))
            server.close()
        ended_at = result.ended_at
        returncode = result.returncode
        leftovers = list(result.leftovers)
        for event in _bootstrap_errors(run_dir):
            router.add_event(event)
        wall_s = max(1e-9, self.wall() - started_at)
        cpu_s = time.process_time() - cpu0
        router.add_event(
            RunEvent(
                t=self.wall(),
                kind="supervisor_usage",
                message=(
                    f"trainmedic used {cpu_s:.2f} s of CPU over {wall_s:.1f} s "
                    f"({cpu_s / wall_s:.1%} of a core)"
                ),
                pid=os.getpid(),
                data={
                    "cpu_s": round(cpu_s, 3),
                    "wall_s": round(wall_s, 3),
                    "gpu_period_s": observers[0].gpu_period_s if observers else None,
                },
            )
        )
        machine = self._machine_facts(
            backend,
            simulation,
            observers[0].host_facts() if observers else None,
            observers[0].first_gpu if observers else {},
        )
        flusher.stop()
        environment = _environment(machine, self.table, options.simulate)
        final_meta = dataclasses.replace(
            meta, ended_at=ended_at, exit_code=returncode, environment=environment
        )
        self._close_record(writer, final_meta)
        if keeper is not None:
            keeper.close()
        with contextlib.suppress(Exception):
            backend.close()
        return RunOutcome(
            run_dir=run_dir,
            returncode=returncode,
            exit_status=exit_status(returncode),
            started_at=started_at,
            ended_at=ended_at,
            machine=machine,
            leftovers=tuple(leftovers),
            attempts=result.attempts,
            record_loss=self.guard.loss(),
        )

    def _open_record(
        self, meta: RunMeta, sinks: list[Any], token: str
    ) -> tuple[RunRecordWriter, MessageRouter, ChannelServer]:
        """The record writer, the message router and the probes' socket, before the job starts.

        Raises:
            RunDirectoryError: the run directory does not take writes (nothing ran;
                what was written is removed again).
        """
        run_dir = self.options.run_dir
        writer: RunRecordWriter | None = None
        try:
            writer = RunRecordWriter(run_dir, guard=self.guard)
            writer.write_meta(meta)
            router = MessageRouter([writer, *sinks], self.table, self.wall)
            server = ChannelServer(run_dir, token, router.on_message, router.on_problem)
        except (OSError, RunDirectoryError) as exc:
            if writer is not None:
                writer.close()
            _discard(run_dir, remove_dir=self.options.created_dir)
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise RunDirectoryError(
                f"cannot write the run directory {printable(str(run_dir))}: {reason}"
            ) from None
        self.guard.reserve(run_dir)
        return writer, router, server

    def _start_keeper(
        self, server: ChannelServer, router: MessageRouter
    ) -> OutputKeeper | None:
        """The output keeper (the job's output outlives a killed supervisor), or ``None``."""
        if not self.keep_output:
            return None
        address = server.address
        try:
            return OutputKeeper.start(
                self.options.run_dir,
                address[len("unix:") :] if address.startswith("unix:") else None,
                self.guard.reserve_path,
            )
        except OSError as exc:
            router.add_event(
                RunEvent(
                    t=self.wall(),
                    kind="keeper_error",
                    message=f"the output keeper did not start ({exc}): if trainmedic is "
                    "killed, the job loses the reader of its output",
                )
            )
            return None

    def _close_record(self, writer: RunRecordWriter, meta: RunMeta) -> None:
        """The record's last lines and final meta.json; a full disk is noted, never raised."""
        guard = self.guard
        writer.close()
        loss = guard.loss()
        if loss is not None:
            guard.release()  # room for the final metadata and the findings
            meta = dataclasses.replace(
                meta, environment={**meta.environment, "record_loss": loss.to_data()}
            )
        try:
            writer.write_meta(meta)
        except OSError as exc:
            guard.trip(exc, META_FILE)
        guard.release()

    def _machine_facts(
        self,
        backend: GpuBackend,
        simulation: Simulation | None,
        host: HostFacts | None,
        first_gpu: Mapping[int, GpuSample],
    ) -> MachineFacts | None:
        if host is None:
            return None
        try:
            driver = backend.driver()
        except Exception:
            driver = None
        gpus = GpuFacts(
            backend=backend.kind,
            driver=driver,
            samples=tuple(first_gpu[i] for i in sorted(first_gpu)),
            absent_reason=backend.absent_reason,
        )
        if simulation is not None and simulation.torch is not None:
            torch: TorchBuild | None = simulation.torch
        else:
            torch = self._torch_build()
        return MachineFacts(host=host, gpu=gpus, torch=torch)

    def _torch_build(self) -> TorchBuild | None:
        """The job's torch as its probe saw it, else the installed one read from files."""
        info = self.table.torch_info()
        if info is None:
            return read_torch_build(import_torch=False)
        return TorchBuild(
            version=info.version,
            cuda_version=parse_cuda_version(info.cuda_version),
            arch_list=info.arch_list,
            cudnn_version=info.cudnn_version,
            cudnn_available=info.cudnn_version is not None,
            cuda_available=info.cuda_initialized,
            probed=info.cuda_initialized,
        )


def _roles(table: ProcessTable) -> dict[int, str]:
    """What the probes said each process does: DataLoader worker, or training (it marks steps)."""
    roles: dict[int, str] = {}
    for pid, state in table.snapshot().items():
        if state.hello.role == "worker":
            roles[pid] = ROLE_WORKER
        elif state.last_heartbeat is not None and state.last_heartbeat.steps > 0:
            roles[pid] = ROLE_TRAIN
    return roles


def _sampler_error(what: str, exc: BaseException, t: float) -> RunEvent:
    return RunEvent(
        t=t,
        kind="sampler_error",
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


def _bootstrap_errors(run_dir: Path) -> list[RunEvent]:
    """Probe bootstraps that failed to load leave a line each; they become events."""
    path = run_dir / probe_env.BOOTSTRAP_ERRORS
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    events = []
    for line in lines[:100]:
        pid_text, _, message = line.partition(" ")
        events.append(
            RunEvent(
                t=path.stat().st_mtime,
                kind="probe_error",
                message=f"probe could not load: {message}",
                pid=int(pid_text) if pid_text.isdigit() else None,
                data={"part": "bootstrap"},
            )
        )
    return events


def _environment(
    machine: MachineFacts | None, table: ProcessTable, simulate: str | None
) -> dict[str, Any]:
    """The machine and the job's torch, as JSON-ready data for meta.json."""
    env: dict[str, Any] = {"simulation": simulate}
    if machine is not None:
        host = machine.host
        env["host"] = {
            "hostname": host.hostname,
            "logical_cores": host.cpu.logical_cores,
            "usable_cores": host.cpu.usable_cores,
            "memory_total_bytes": host.memory.total_bytes,
        }
        env["gpu"] = {
            "backend": machine.gpu.backend,
            "driver": None if machine.gpu.driver is None else machine.gpu.driver.version,
            "absent_reason": machine.gpu.absent_reason,
            "gpus": [
                {
                    "index": s.index,
                    "name": s.name,
                    "uuid": s.uuid,
                    "memory_total_bytes": s.memory_total_bytes,
                }
                for s in machine.gpu.samples
            ],
        }
    info = table.torch_info()
    if info is not None:
        env["torch"] = {
            "version": info.version,
            "cuda_version": info.cuda_version,
            "cudnn_version": info.cudnn_version,
            "cuda_initialized": info.cuda_initialized,
            "devices": list(info.devices),
        }
    elif machine is not None and machine.torch is not None:
        env["torch"] = {
            "version": machine.torch.version,
            "cuda_version": machine.torch.cuda_version,
        }
    env["processes"] = len(table.snapshot())
    return env


def _discard(run_dir: Path, remove_dir: bool) -> None:
    """Remove what this run wrote when its job never started (the directory was
    empty or new: everything in it is ours)."""
    for entry in list(run_dir.iterdir()) if run_dir.is_dir() else []:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
    if remove_dir:
        with contextlib.suppress(OSError):
            run_dir.rmdir()


def _flush(writer: RunRecordWriter, period_s: float) -> float:
    writer.flush()
    return period_s
