"""One supervised run, from launch to a closed run record.

:class:`RunSession` wires the parts of the supervisor together and runs them
as observe -> decide -> act: the launcher starts the job; the channel, the
samplers and the output pumps observe it into the run record and the live
view; signals become decisions of the :class:`SignalForwarder`; when the job
ends, the session winds everything down in an order that loses nothing
(output drained, leftovers stopped, probes' last messages read, record
closed) and returns a :class:`RunOutcome`. Diagnosis and reports are the
caller's (the ``run`` command). The samplers, live view and host facts are
in :mod:`.observe.observers`; what the record keeps about the machine, in
:mod:`.run_facts`.

Why one module of this length: it owns the run's resources on one ``ExitStack`` and
winds them down in one order; the parts it wires are modules of their own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from trainmedic import __version__
from trainmedic.channel.server import ChannelServer
from trainmedic.doctor.facts import MachineFacts
from trainmedic.errors import RunDirectoryError
from trainmedic.gpu.backend import GpuBackend
from trainmedic.gpu.factory import open_nvml_or_none
from trainmedic.ostext import printable
from trainmedic.record.events import EventKind
from trainmedic.record.guard import RecordGuard, RecordLoss, WriteFn
from trainmedic.record.store import META_FILE, RunRecordWriter
from trainmedic.record.types import RunEvent, RunMeta
from trainmedic.resilience.incidents import AttemptSummary
from trainmedic.simulation import Simulation, load_simulation
from trainmedic.supervise.fallback import run_on_unsupervised
from trainmedic.supervise.hang.watchdog import Watchdog
from trainmedic.supervise.launch.launcher import (
    become_subreaper,
    exit_status,
    probe_environment,
    same_destination,
)
from trainmedic.supervise.launch.signals import forwarding_signals
from trainmedic.supervise.live.metrics import MetricsState
from trainmedic.supervise.live.status import LiveAggregate
from trainmedic.supervise.loop.attempt_setup import (
    AttemptIO,
    CurrentJob,
    LoopResult,
    ResilienceOptions,
    StopRequests,
)
from trainmedic.supervise.loop.attempt_state import AttemptTracker, Listener
from trainmedic.supervise.loop.attempts import AttemptLoop
from trainmedic.supervise.observe.observers import Observers
from trainmedic.supervise.observe.outside_stacks import HANDOVER_AFTER_S, OutsideStacks
from trainmedic.supervise.observe.processes import MessageRouter, ProcessTable
from trainmedic.supervise.observe.samplers import SamplerThread
from trainmedic.supervise.output.keeper import OutputKeeper
from trainmedic.supervise.output.stream import TerminalMux
from trainmedic.supervise.run_facts import bootstrap_errors, environment, machine_facts
from trainmedic.supervise.rundir import command_name

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
        resilience: hang detection, restarts and resume (:mod:`.loop.attempts`).
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
        self.script: dict[str, Any] | None = None
        """The training script's identity as the job started (``script_facts``)."""
        self.environ = dict(os.environ if environ is None else environ)
        self.outside: OutsideStacks | None = None
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

        The session's resources (GPU backend, record writer, channel server,
        output keeper, record flusher, observers) are entered in order on one
        :class:`contextlib.ExitStack`: whatever happens they are released in
        reverse, and a run whose job never started leaves nothing behind.

        Raises:
            CommandNotFoundError / CommandNotExecutableError: the job could not
                start (the run directory is removed again).
            SimulationFileError: a bad ``--simulate`` file.
            RunDirectoryError: the run directory cannot be written (nothing ran).
        """
        options = self.options
        simulation = load_simulation(options.simulate) if options.simulate else None
        backend: GpuBackend = simulation.backend if simulation is not None else open_nvml_or_none()
        started_at = self.wall()
        meta = self._meta(backend.kind, started_at)
        aggregate = LiveAggregate(started_at)
        current: list[CurrentJob] = []
        observers: list[Observers] = []
        watchdog = Watchdog(
            self.table, lambda: current[0].descendants() if current else [], wall=self.wall
        )
        mode = self._live_mode()
        mux = TerminalMux(self.stdout_fd, self.stderr_fd, panel=mode == "panel")

        def start_observers(job: CurrentJob) -> None:
            current.append(job)
            observers.append(
                Observers(
                    job,
                    backend,
                    simulation,
                    router,
                    aggregate,
                    mux,
                    mode,
                    table=self.table,
                    wall=self.wall,
                    title=command_name(options.argv),
                    stderr_fd=self.stderr_fd,
                    helpers=None if self.outside is None else self.outside.running,
                )
            )

        with contextlib.ExitStack() as stack:
            stack.callback(_close_quietly, backend)
            token = secrets.token_hex(16)
            writer, router, server = self._open_record(
                meta, self._sinks(aggregate, watchdog), token
            )
            stack.push(_if_never_started(observers, self._discard))
            stack.callback(writer.close)
            env = probe_environment(
                self.environ, server.address, token, options.run_dir, probe=options.probe
            )
            become_subreaper()
            server.start()
            stack.callback(server.close)
            if self.outside is not None:
                stack.callback(self.outside.stop)
            keeper = self._start_keeper(server, router)
            if keeper is not None:
                # Once the job runs, the keeper stays to carry its output on.
                stack.push(_if_never_started(observers, keeper.close))
            flusher = SamplerThread(
                "record-flush", lambda: _flush(writer, FLUSH_EVERY_S), lambda _e: None
            )
            flusher.start()
            stack.callback(flusher.stop)
            stack.callback(_stop_all, observers)
            cpu0 = time.process_time()
            listeners: tuple[Listener, ...] = (aggregate.attempt_changed,)
            if self.metrics is not None:
                listeners += (self.metrics.attempt_changed,)
            loop = self._attempt_loop(
                env, mux, keeper, router, watchdog, server, start_observers, backend.kind,
                listeners,
            )
            # Signals are handled from before the job exists: a Ctrl-C while it starts
            # is delivered to it as soon as it does, never lost and never an orphan.
            stops = loop.stops
            with forwarding_signals(stops, on_resize=lambda: stops.resize(self.stdout_fd)):
                result = _supervise(loop, mux.notice, router.add_event, self.wall)
                if self.outside is not None:
                    self.outside.stop()
                for o in observers:
                    o.stop()
                    router.add_event(o.census.event(self.wall(), probe=options.probe))
                server.close()
            machine = self._wind_up(router, observers, backend, simulation, started_at, cpu0)
            flusher.stop()
            final_meta = dataclasses.replace(
                meta,
                ended_at=result.ended_at,
                exit_code=result.returncode,
                environment={
                    **environment(machine, self.table, options.simulate),
                    **({"script": self.script} if self.script else {}),
                },
            )
            self._close_record(writer, final_meta)
            if keeper is not None:
                keeper.close()
        return RunOutcome(
            run_dir=options.run_dir,
            returncode=result.returncode,
            exit_status=exit_status(result.returncode),
            started_at=started_at,
            ended_at=result.ended_at,
            machine=machine,
            leftovers=result.leftovers,
            attempts=result.attempts,
            record_loss=self.guard.loss(),
        )

    def _meta(self, gpu_backend: str, started_at: float) -> RunMeta:
        """The run's metadata as the job starts (``meta.json``, completed at the end)."""
        from trainmedic.supervise.script_facts import script_facts

        options = self.options
        script = script_facts(options.argv, Path(options.cwd or os.getcwd()))
        self.script = script
        return RunMeta(
            run_id=printable(options.run_dir.name),
            command=tuple(printable(a) for a in options.argv),
            cwd=printable(options.cwd or os.getcwd()),
            started_at=started_at,
            trainmedic_version=__version__,
            gpu_backend=gpu_backend,
            environment={"script": script} if script else {},
        )

    def _sinks(self, aggregate: LiveAggregate, watchdog: Watchdog) -> list[Any]:
        """Where the probes' messages go besides the record: the live view's
        aggregate, the watchdog and the Prometheus exporter's state."""
        sinks: list[Any] = [aggregate, watchdog]
        if self.metrics is not None:
            self.metrics.warnings = lambda: aggregate.status(self.wall()).warnings
            sinks.append(self.metrics)
        return sinks

    def _attempt_loop(
        self,
        env: dict[str, str],
        mux: TerminalMux,
        keeper: OutputKeeper | None,
        router: MessageRouter,
        watchdog: Watchdog,
        server: ChannelServer,
        start_observers: Callable[[CurrentJob], None],
        gpu_backend_kind: str,
        listeners: tuple[Listener, ...] = (),
    ) -> AttemptLoop:
        options = self.options
        merged = same_destination(self.stdout_fd, self.stderr_fd)
        logs = (
            ((self.stdout_fd, OUTPUT_LOG),)
            if merged
            else ((self.stdout_fd, STDOUT_LOG), (self.stderr_fd, STDERR_LOG))
        )
        io = AttemptIO(
            self.stdout_fd,
            self.stderr_fd,
            merged,
            mux,
            logs,
            record_guard=self.guard,
            keeper=keeper,
        )
        return AttemptLoop(
            argv=options.argv,
            cwd=options.cwd,
            env=env,
            run_dir=options.run_dir,
            options=options.resilience,
            io=io,
            router_event=router.add_event,
            watchdog=watchdog,
            stops=StopRequests(None, mux.notice),
            wait_idle=server.wait_idle,
            start_observers=start_observers,
            gpu_backend_kind=gpu_backend_kind,
            wall=self.wall,
            tracker=AttemptTracker(listeners),
        )

    def _wind_up(
        self,
        router: MessageRouter,
        observers: Sequence[Observers],
        backend: GpuBackend,
        simulation: Simulation | None,
        started_at: float,
        cpu0: float,
    ) -> MachineFacts | None:
        """The record's last events (probe bootstraps that failed, what supervising
        cost) and the machine's facts for diagnosis."""
        for event in bootstrap_errors(self.options.run_dir):
            router.add_event(event)
        wall_s = max(1e-9, self.wall() - started_at)
        cpu_s = time.process_time() - cpu0
        router.add_event(
            RunEvent(
                t=self.wall(),
                kind=EventKind.SUPERVISOR_USAGE,
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
        return machine_facts(
            self.table,
            backend,
            simulation,
            observers[0].host_facts() if observers else None,
            observers[0].first_gpu if observers else {},
        )

    def _discard(self) -> None:
        _discard(self.options.run_dir, remove_dir=self.options.created_dir)

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
            self.outside = self._outside_stacks(router)
            server = ChannelServer(
                run_dir,
                token,
                router.on_message,
                router.on_problem,
                on_ring=None if self.outside is None else self.outside.ring_taken,
            )
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

    def _outside_stacks(self, router: MessageRouter) -> OutsideStacks | None:
        """The sampler of the training processes' stacks from outside, unless the probe
        is off or its stack parts are switched off (then nothing samples, or the probe)."""
        from trainmedic.probe.env import disabled_parts

        off = disabled_parts(self.environ) & {"all", "stacks", "ring", "outside_stacks"}
        if not self.options.probe or off:
            return None
        table, wall = self.table, self.wall

        def ready(pid: int) -> bool:
            state = table.get(pid)
            since = None if state is None else state.sampled_since
            return since is not None and wall() - since >= HANDOVER_AFTER_S

        return OutsideStacks(router.on_message, router.add_event, self.wall, ready=ready)

    def _start_keeper(self, server: ChannelServer, router: MessageRouter) -> OutputKeeper | None:
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
                    kind=EventKind.KEEPER_ERROR,
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


def _supervise(
    loop: AttemptLoop,
    notice: Callable[[str], None],
    add_event: Callable[[RunEvent], None],
    wall: Callable[[], float],
) -> LoopResult:
    """The attempts of the job. A bug of the supervisor must not cost the job its
    run or its exit status: once the job runs, supervision stops and the job
    runs on to its end; before, the error propagates."""
    try:
        return loop.run()
    except Exception as exc:
        if loop.current is None:
            raise
        return run_on_unsupervised(loop, exc, notice, add_event, wall)


_ExitCallback = Callable[
    [type[BaseException] | None, BaseException | None, TracebackType | None], bool
]


def _if_never_started(observers: Sequence[Observers], action: Callable[[], None]) -> _ExitCallback:
    """An exit callback that runs ``action`` when the session fails before the
    job started (no observers yet)."""

    def on_exit(
        exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if exc_type is not None and not observers:
            action()
        return False

    return on_exit


def _stop_all(observers: Sequence[Observers]) -> None:
    for o in observers:
        o.stop()


def _close_quietly(backend: GpuBackend) -> None:
    with contextlib.suppress(Exception):
        backend.close()


def _flush(writer: RunRecordWriter, period_s: float) -> float:
    writer.flush()
    return period_s
