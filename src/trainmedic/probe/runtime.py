"""The probe in one process of the job: its state, its background thread, its lifecycle.

:func:`activate` runs from the bootstrap ``sitecustomize`` when the
supervisor's environment variables are present. It must be cheap, since it
runs at every Python start-up of the job: it imports almost nothing, chains
the exception hooks, registers fork and exit handlers, starts one daemon
thread and waits for the job to import torch
(:mod:`trainmedic.probe.importhook`); only then are the torch hooks (and the
step tracker) loaded. The background thread loads the channel code itself,
off the job's start-up path.

The training thread never does I/O for the probe. Hooks update the step
tracker and append to an in-memory outbox; the background thread builds the
records, sends the outbox every :data:`FLUSH_S` and a heartbeat every
:data:`HEARTBEAT_S`. At exit the rest is sent synchronously. A process that
ends before its first connection (:data:`FIRST_CONNECT_DELAY_S`) having
nothing to say sends nothing: short helper processes stay cheap.

A forked child (a DataLoader worker with the fork start method, or the job's
own ``multiprocessing``) inherits this object: the fork handler resets it so
the child reports as its own process, over its own connection.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from collections import deque

from trainmedic.probe.env import ProbeConfig
from trainmedic.probe.importhook import when_imported
from trainmedic.probe.parts import Part, Parts

TYPE_CHECKING = False  # typing itself is not worth importing at the job's start-up
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType, TracebackType
    from typing import Any

    from trainmedic.channel.client import ChannelClient
    from trainmedic.channel.wire import ProbeMessage, TorchInfo
    from trainmedic.probe.forensics import StackDumps
    from trainmedic.probe.forward import ForwardWatch
    from trainmedic.probe.sampling import StackSampler, StepStats
    from trainmedic.probe.steps import StepDraft, StepTracker
    from trainmedic.record.types import RunEvent

FLUSH_S = 0.25
"""Seconds between two sends of the outbox."""
HEARTBEAT_S = 1.0
"""Seconds between two heartbeats."""
FIRST_CONNECT_DELAY_S = 0.2
"""The first connection waits this long (the hello then carries the final
``sys.argv``, and processes shorter than this with nothing to say send nothing)."""
MAX_OUTBOX = 100_000
"""Messages kept while the supervisor is slow; more are counted and dropped."""
BATCH_STEPS = 64
"""Steps per ``steps`` line at most. The probe's thread yields the interpreter
to the training thread after each line (``time.sleep(0)``), so that it never
holds the GIL for long while the training thread waits for it."""
IDLE_STEPS_S = 2.0
"""Seconds without a step (and at least 3 usual steps), the job working, after
which the probe's thread asks the forward watch to look for new root modules."""
HEARTBEAT_FRAMES = 6
EXIT_JOIN_S = 2.0


class HookState:
    """What every hook reads on each call, kept in one small object.

    Attributes:
        depth: 1 while an outermost module call runs on the training thread.
        training_ident: the thread whose calls are timed (``None``: none, in a worker).
        pin_threads: pin-memory threads of this process's DataLoaders.
        loader_used: whether a DataLoader batch was ever fetched here.
        worker_ident: a DataLoader worker's loading thread.
    """

    __slots__ = ("depth", "loader_used", "pin_threads", "training_ident", "worker_ident")

    def __init__(self, training_ident: int | None) -> None:
        self.depth = 0
        self.training_ident = training_ident
        self.pin_threads: set[int] = set()
        self.loader_used = False
        self.worker_ident: int | None = None


_PROBE: Probe | None = None


def current() -> Probe | None:
    """The active probe of this process, or ``None`` outside a ``trainmedic run``."""
    return _PROBE


def activate(environ: dict[str, str] | None = None) -> Probe | None:
    """Start the probe when the environment names a supervisor; idempotent."""
    global _PROBE
    if _PROBE is not None:
        return _PROBE
    config = ProbeConfig.from_environ(environ)
    if config is None or "all" in config.disabled:
        return None
    probe = Probe(config)
    _PROBE = probe
    probe.start()
    return probe


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def _short_name(filename: str) -> str:
    parts = filename.replace("\\", "/").rsplit("/", 2)
    return "/".join(parts[-2:])


class Probe:
    """Everything the probe knows and does in this process."""

    def __init__(
        self,
        config: ProbeConfig,
        clock: Callable[[], float] = time.perf_counter,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.clock = clock
        self.wall = wall
        self.wall_offset = wall() - clock()
        self.started_at = wall()
        self.pid = os.getpid()
        self.role = "process"
        self.rank = _env_int("RANK")
        self.local_rank = _env_int("LOCAL_RANK")
        self.parts = Parts(config.disabled, config.inject_fault, self._report_part_error)
        self.state = HookState(training_ident=threading.main_thread().ident)
        self.tracker: StepTracker | None = None
        self.forward: ForwardWatch | None = None
        self.step_stats: StepStats | None = None
        self.cuda: Any = None
        self.torch: ModuleType | None = None
        self.restore: list[Callable[[], None]] = []
        # Messages, and finished steps as (draft, timing, alloc) to build records from.
        self.outbox: deque[ProbeMessage | tuple[StepDraft, Any, Any]] = deque()
        self.dropped = 0
        self.client: ChannelClient | None = None
        self.failed = False  # the channel broke: queue nothing more
        self.sampler: StackSampler | None = None
        self._stop = threading.Event()
        self._agent: threading.Thread | None = None
        self._agent_lock = threading.Lock()
        self._hello_due = True
        self._connected = False
        self._finished = False
        # (steps, forward calls, work, since when, discovery asked) as the agent last saw them.
        self._forward_mark: tuple[int, int, int, float, bool] = (0, 0, 0, 0.0, False)
        # Set by the stack signal's handler, read by the agent (no lock: see forensics).
        self.dump_requested = False
        self.stack_dumps: StackDumps | None = None

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        part = self.parts["exceptions"]
        if part.on:
            try:
                part.check()
                self._chain_excepthooks()
            except Exception as exc:
                part.fail(exc)
        self._install_forensics()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork_child)
        atexit.register(self.at_exit)
        self._ensure_agent()
        when_imported("torch", self._on_torch)

    def _ensure_agent(self) -> None:
        if self._agent is not None:
            return
        with self._agent_lock:
            if self._agent is None:
                self._agent = threading.Thread(
                    target=self._agent_main, name="trainmedic-probe", daemon=True
                )
                self._agent.start()

    def _after_fork_child(self) -> None:
        # Only this thread exists in the child: replace every lock-bearing object.
        self.pid = os.getpid()
        self.started_at = self.wall()
        self.role = "forked"
        if self.client is not None:
            self.client.abandon()
            self.client = None
        self.failed = False
        self.outbox = deque()
        self.dropped = 0
        self._stop = threading.Event()
        self._agent = None
        self._agent_lock = threading.Lock()
        self._hello_due = True
        self._connected = False
        self._finished = False
        self.dump_requested = False
        self.sampler = None
        if self.step_stats is not None:
            self.step_stats = type(self.step_stats)()
        self.state.depth = 0
        self.state.training_ident = threading.get_ident()
        self.state.pin_threads = set()
        self.state.loader_used = False
        self.state.worker_ident = None
        if self.tracker is not None:
            self.tracker.reset()
        if self.cuda is not None:
            self.cuda.reset()

    def at_exit(self) -> None:
        """Send what is left, then a goodbye (runs from ``atexit`` or a worker's end)."""
        if self._finished:
            return
        self._finished = True
        steps = self.parts["steps"]
        if steps.on and self.tracker is not None:
            try:
                self.tracker.finish(self.clock())
            except Exception as exc:
                steps.fail(exc)
        if self.cuda is not None:
            self.cuda.flush()
        # Read before the threads end: a thread's CPU clock goes with it.
        cpu_s = self._threads_cpu_s()
        if self.sampler is not None:
            self.sampler.stop()
        self._stop.set()
        agent = self._agent
        if agent is not None and agent.is_alive() and agent is not threading.current_thread():
            agent.join(EXIT_JOIN_S)
            if agent.is_alive():
                return  # the agent is stuck in a send; don't race it on the socket
        if not self._connected and not self.outbox:
            return  # a short process with nothing to say: no connection at all
        from trainmedic.channel.wire import Goodbye

        if self.dropped:
            self.emit(
                self._event(
                    "probe_dropped",
                    f"probe dropped {self.dropped} message(s): the supervisor did not keep up",
                    {"dropped": self.dropped},
                )
            )
        now = self.wall()
        self.emit(
            Goodbye(
                pid=self.pid,
                t=now,
                probe_cpu_s=cpu_s,
                probe_wall_s=max(0.0, now - self.started_at),
                stack_samples=None if self.sampler is None else self.sampler.samples,
            )
        )
        self._flush()

    def _threads_cpu_s(self) -> float | None:
        """CPU time of the probe's own threads in this process so far, seconds."""
        threads = [self._agent, None if self.sampler is None else self.sampler.thread]
        total = 0.0
        try:
            for thread in threads:
                if thread is not None and thread.ident is not None and thread.is_alive():
                    total += time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except (AttributeError, OSError):
            return None  # no per-thread CPU clocks here
        return total

    # --- forensics -------------------------------------------------------------------------------

    def _install_forensics(self) -> None:
        """Stacks on demand (:mod:`trainmedic.probe.forensics`), when the supervisor
        named a stacks file for this attempt."""
        part = self.parts["forensics"]
        stacks_file = os.environ.get("TRAINMEDIC_PROBE_STACKS")  # forensics.STACKS_ENV
        if not part.on or not stacks_file:
            return
        try:
            part.check()
            from trainmedic.probe.forensics import StackDumps

            self.stack_dumps = StackDumps(stacks_file, self._request_dump)
            self.stack_dumps.install()
        except Exception as exc:
            part.fail(exc)

    def _request_dump(self) -> None:
        # Runs inside a signal handler: set a flag, nothing else.
        self.dump_requested = True

    def _dump_stacks(self) -> None:
        part = self.parts["forensics"]
        dumps = self.stack_dumps
        if not part.on or dumps is None:
            return
        try:
            from trainmedic.probe import forensics

            tracker = self.tracker
            extra = {
                "phase": "train" if tracker is None else tracker.phase,
                "activity": "other" if tracker is None else tracker.activity,
                "steps": 0 if tracker is None else tracker.train_steps,
            }
            data = forensics.collect(self.pid, self.role, self.state.training_ident, extra)
            forensics.write_json(forensics.json_path(dumps.stacks_file, self.pid), data)
        except Exception as exc:
            part.fail(exc)

    # --- exceptions ------------------------------------------------------------------------------

    def _chain_excepthooks(self) -> None:
        """Record uncaught exceptions first, then let the previous hooks print them."""
        previous = sys.excepthook
        part = self.parts["exceptions"]

        def excepthook(
            exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None
        ) -> None:
            if part.on:
                try:
                    from trainmedic.probe import crash

                    self._record_exception(
                        crash.exception_event("exception", exc_type, exc, tb, self.pid)
                    )
                except Exception as error:
                    part.fail(error)
            previous(exc_type, exc, tb)

        sys.excepthook = excepthook
        previous_thread = threading.excepthook

        def thread_excepthook(args: threading.ExceptHookArgs) -> None:
            if part.on and args.exc_type is not SystemExit:
                try:
                    from trainmedic.probe import crash

                    name = args.thread.name if args.thread is not None else None
                    event = crash.exception_event(
                        "thread_exception",
                        args.exc_type,
                        args.exc_value,
                        args.exc_traceback,
                        self.pid,
                        name,
                    )
                    self._record_exception(event)
                except Exception as error:
                    part.fail(error)
            previous_thread(args)

        threading.excepthook = thread_excepthook

    def _record_exception(self, event: RunEvent) -> None:
        self.emit(event)
        if event.kind == "exception" and self.config.run_dir:
            from trainmedic.probe import crash

            crash.write_error_file(self.config.run_dir, event, list(sys.argv))

    # --- torch -----------------------------------------------------------------------------------

    def _on_torch(self, torch: ModuleType) -> None:
        try:
            self._install_torch(torch)
        except Exception as exc:
            self.parts["steps"].fail(exc)

    def _ensure_tracker(self) -> StepTracker:
        if self.tracker is None:
            from trainmedic.probe.steps import StepTracker

            self.tracker = StepTracker(emit=self._on_draft)
        return self.tracker

    def _install_torch(self, torch: ModuleType) -> None:
        from trainmedic.probe import torch_hooks
        from trainmedic.probe.cuda import CudaSteps
        from trainmedic.probe.sampling import StepStats

        self.torch = torch
        tracker = self._ensure_tracker()
        if self.step_stats is None:
            self.step_stats = StepStats()
        # A CPU-only build of torch never initialises CUDA: no CUDA part at all.
        if self.parts["cuda"].on and getattr(torch.version, "cuda", None):
            self.cuda = CudaSteps(torch, self.parts["cuda"], self._finish_step, self._cuda_ready)
            tracker.listener = self.cuda
        torch_hooks.install(torch, self)
        if os.environ.get("TRAINMEDIC_APPLY"):  # trainmedic run --apply-from
            from trainmedic.probe import apply  # never raises: its errors become events

            apply.install(torch, self)
        self.emit(self._torch_info(torch, cuda_ready=False))

    def _torch_info(self, torch: Any, cuda_ready: bool) -> TorchInfo:
        from trainmedic.channel.wire import TorchInfo

        devices: tuple[str, ...] = ()
        arch: tuple[str, ...] = ()
        cudnn: int | None = None
        if cuda_ready:
            cuda = torch.cuda
            devices = tuple(str(cuda.get_device_name(i)) for i in range(cuda.device_count()))
            arch = tuple(str(a) for a in cuda.get_arch_list())
            version = torch.backends.cudnn.version()
            cudnn = int(version) if version is not None else None
        return TorchInfo(
            pid=self.pid,
            t=self.wall(),
            version=str(torch.__version__),
            cuda_version=getattr(torch.version, "cuda", None),
            cudnn_version=cudnn,
            cuda_initialized=cuda_ready,
            devices=devices,
            arch_list=arch,
        )

    def _cuda_ready(self) -> None:
        try:
            self.emit(self._torch_info(self.torch, cuda_ready=True))
        except Exception as exc:
            self.parts["cuda"].fail(exc)

    # --- steps -----------------------------------------------------------------------------------

    def _on_draft(self, draft: StepDraft) -> None:
        # Once per step on the training thread: kept to a few lines, no I/O.
        watch = self.forward
        if watch is not None and watch.pending:
            try:
                watch.step_closed(draft.t_end)
            except Exception as exc:
                self.parts["forward"].fail(exc)
        if self.cuda is not None:
            self.cuda.add(draft)
        elif not self.failed and len(self.outbox) < MAX_OUTBOX:
            self.outbox.append((draft, None, None))
            if not self.state.loader_used and self.sampler is None:
                self.step_marked()
        elif not self.failed:
            self.dropped += 1

    def _finish_step(self, draft: StepDraft, timing: Any, alloc: Any) -> None:
        # The record is built by the background thread: the training thread only queues.
        if not self.failed and len(self.outbox) < MAX_OUTBOX:
            self.outbox.append((draft, timing, alloc))
            if not self.state.loader_used and self.sampler is None:
                self.step_marked()
        elif not self.failed:
            self.dropped += 1

    def _step_row(self, draft: StepDraft, timing: Any, alloc: Any) -> list[Any]:
        """The step's values in :data:`~trainmedic.channel.wire.STEP_COLUMNS` order
        (the probe's thread builds them: the training thread only queued the draft)."""
        _, duration, outside, data_wait, compute = draft.times()
        gpu_time: float | None = None
        if timing is not None:
            gpu_time = timing.gpu_time_s
            if (
                draft.loader_fetches == 0
                and compute is not None
                and timing.idle_before_s is not None
            ):
                # The GPU's idle gap before the step, not host time spent in a sync.
                data_wait = min(outside, timing.idle_before_s)
        if alloc is None:
            return [
                draft.step, draft.t_end + self.wall_offset, duration, data_wait, compute,
                gpu_time, draft.samples, draft.source, draft.phase, None, None, None, None,
                draft.autocast,
            ]  # fmt: skip
        return [
            draft.step, draft.t_end + self.wall_offset, duration, data_wait, compute,
            gpu_time, draft.samples, draft.source, draft.phase, alloc.alloc_peak_bytes,
            alloc.reserved_peak_bytes, alloc.alloc_retries, alloc.ooms, draft.autocast,
        ]  # fmt: skip

    def adopt_training_thread(self) -> bool:
        """Make the calling thread the training thread when no step was marked yet."""
        tracker = self._ensure_tracker()
        if tracker.started or self.role == "worker":
            return False
        self.state.training_ident = threading.get_ident()
        tracker.reset()
        return True

    def _api(self, action: Callable[[StepTracker, float], None]) -> None:
        part = self.parts["steps"]
        if not part.on:
            return
        try:
            part.check()
            tracker = self._ensure_tracker()
            if (
                threading.get_ident() != self.state.training_ident
                and not self.adopt_training_thread()
            ):
                return
            action(tracker, self.clock())
        except Exception as exc:
            part.fail(exc)

    def api_step(self) -> None:
        """``trainmedic.step()``."""
        self._api(lambda tracker, now: tracker.api_step(now))

    def api_phase_enter(self, name: str) -> None:
        """``with trainmedic.phase(name):`` begins."""
        self._api(lambda tracker, now: tracker.phase_enter(now, name))

    def api_phase_exit(self) -> None:
        self._api(lambda tracker, now: tracker.phase_exit(now))

    # --- loaders ---------------------------------------------------------------------------------

    def loader_in_use(self) -> None:
        """Called on the first DataLoader fetch of the training thread."""
        if not self.state.loader_used:
            self.state.loader_used = True
            self._start_sampler()

    def loader_created(self, loader: Any, loader_id: int) -> None:
        """A DataLoader was iterated for the first time: send its settings."""
        from trainmedic.record.types import LoaderInfo

        num_workers = int(loader.num_workers)
        dataset = loader.dataset
        dataset_len: int | None = None
        iterable_cls = getattr(getattr(self.torch, "utils", None), "data", None)
        iterable_cls = getattr(iterable_cls, "IterableDataset", None)
        is_iterable = iterable_cls is not None and isinstance(dataset, iterable_cls)
        if not is_iterable and hasattr(dataset, "__len__"):
            try:
                dataset_len = len(dataset)
            except Exception:
                dataset_len = None
        prefetch = getattr(loader, "prefetch_factor", None)
        batch = loader.batch_size
        self.emit(
            LoaderInfo(
                t=self.wall(),
                pid=self.pid,
                loader_id=loader_id,
                num_workers=num_workers,
                batch_size=None if batch is None else int(batch),
                pin_memory=bool(loader.pin_memory),
                prefetch_factor=int(prefetch) if prefetch is not None and num_workers > 0 else None,
                persistent_workers=bool(loader.persistent_workers),
                dataset_type=f"{type(dataset).__module__}.{type(dataset).__qualname__}",
                dataset_len=dataset_len,
            )
        )

    def become_worker(self) -> None:
        """This process runs a DataLoader worker loop: report, sample, never mark steps."""
        try:
            self.role = "worker"
            self.state.training_ident = None
            self.state.worker_ident = threading.get_ident()
            if self.forward is not None:
                # A worker times no forward calls: its transforms' module calls
                # (torchvision v2 transforms are modules) pass no wrapper at all.
                self.forward.uninstall()
            self._hello_due = True
            self._ensure_agent()
            self._start_sampler()
        except Exception as exc:
            self.parts["stacks"].fail(exc)

    def worker_done(self) -> None:
        """The worker loop returned: flush now (multiprocessing skips ``atexit``)."""
        try:
            self.at_exit()
        except Exception as exc:
            self.parts["stacks"].fail(exc)

    # --- stack sampling --------------------------------------------------------------------------

    def _start_sampler(self) -> None:
        part = self.parts["stacks"]
        if self.sampler is not None or not part.on:
            return
        try:
            from trainmedic.probe.sampling import MainPolicy, StackSampler, StepStats, WorkerPolicy

            policy: MainPolicy | WorkerPolicy
            if self.role == "worker":
                policy = WorkerPolicy()
            else:
                if self.step_stats is None:
                    self.step_stats = StepStats()
                policy = MainPolicy(self.step_stats, self._waiting_since, self.clock)
            self.sampler = StackSampler(
                targets=self._stack_targets,
                emit=self.emit,
                on_error=part.fail,
                pid=self.pid,
                wall=self.wall,
                check=part.check,
                period=policy.period,
            )
            self.sampler.start()
        except Exception as exc:
            part.fail(exc)

    def _stack_targets(self) -> list[tuple[int, str]]:
        if not self.parts["stacks"].on:
            return []
        state = self.state
        if self.role == "worker":
            return [] if state.worker_ident is None else [(state.worker_ident, "worker")]
        ident = state.training_ident
        tracker = self.tracker
        if ident is None or tracker is None:
            return []
        if tracker.loader_wait_started is not None:
            return [(ident, "main"), *((t, "pin") for t in list(state.pin_threads))]
        if not state.loader_used and tracker.started and not tracker.in_compute:
            return [(ident, "self")]
        return []

    def _waiting_since(self) -> float | None:
        """When the training thread's current wait for data began (probe clock), or ``None``."""
        tracker = self.tracker
        if tracker is None:
            return None
        since = tracker.loader_wait_started
        if since is None and not self.state.loader_used and not tracker.in_compute:
            since = tracker.outside_since
        return since

    def step_marked(self) -> None:
        """A step ended: scripts without a DataLoader get their batch preparation sampled."""
        if not self.state.loader_used and self.sampler is None:
            self._start_sampler()

    # --- errors ----------------------------------------------------------------------------------

    def _event(self, kind: str, message: str, data: dict[str, Any]) -> RunEvent:
        from trainmedic.record.types import RunEvent

        return RunEvent(t=self.wall(), kind=kind, message=message, pid=self.pid, data=data)

    def _report_part_error(self, part: Part, exc: BaseException, tb: str) -> None:
        self.emit(
            self._event(
                "probe_error",
                f"probe part {part.name!r} disabled after an internal error: {part.error}",
                {"part": part.name, "error": part.error, "traceback": tb},
            )
        )

    # --- the outbox and the background thread ----------------------------------------------------

    def emit(self, message: ProbeMessage) -> None:
        """Queue ``message`` for the supervisor (any thread; never blocks)."""
        if self.failed:
            return
        if len(self.outbox) >= MAX_OUTBOX:
            self.dropped += 1
            return
        self.outbox.append(message)
        if self._agent is None and not self._finished:
            self._ensure_agent()

    def _agent_main(self) -> None:
        stop = self._stop
        if stop.wait(FIRST_CONNECT_DELAY_S) and not self.outbox:
            return
        next_heartbeat = 0.0
        try:
            while True:
                stopping = stop.is_set()
                now = time.monotonic()
                if not stopping:
                    self._sample_main()
                if not stopping and now >= next_heartbeat:
                    next_heartbeat = now + HEARTBEAT_S
                    self._heartbeat()
                if self.dump_requested:
                    self.dump_requested = False
                    self._dump_stacks()
                self._flush()
                if stopping or self.failed:
                    return
                self._watch_forward(now)
                stop.wait(FLUSH_S)
        except Exception:
            # The channel code itself failed (an interpreter shutting down, say):
            # stop reporting; the job goes on.
            self.failed = True
            self.outbox.clear()
            try:
                self._go_quiet()
            except Exception:
                return

    def _sample_main(self) -> None:
        """One sample of the training thread for the next heartbeat
        (:mod:`trainmedic.probe.liveness`)."""
        if not self.parts["heartbeat"].on:
            return
        try:
            samples = self.__dict__.get("_liveness")
            if samples is None or samples[0] != self.pid:  # new, or inherited by a fork
                from trainmedic.probe.liveness import ThreadSamples

                samples = self.__dict__["_liveness"] = (self.pid, ThreadSamples())
            samples[1].sample()
        except Exception as exc:
            self.parts["heartbeat"].fail(exc)

    def _watch_forward(self, now: float) -> None:
        """Ask the forward watch to look for new root modules (it acts at the training
        thread's next step end or fetch): when steps ended with no forward call seen
        (a model of another class took over), when train steps stop for a while but
        the job keeps working (an evaluation, maybe of another model), and routinely."""
        watch = self.forward
        tracker = self.tracker
        if watch is None or tracker is None or watch.discovering or watch.requested:
            return
        steps, forwards, work = sum(tracker.steps_by_phase.values()), tracker.forwards, tracker.work
        last_steps, last_forwards, last_work, since, asked = self._forward_mark
        if steps != last_steps:
            self._forward_mark = (steps, forwards, work, now, False)
            if forwards == last_forwards or self.clock() >= watch.next_routine:
                watch.request()
            return
        stats = self.step_stats
        usual = 3.0 * stats.step_s if stats is not None else 0.0
        if not asked and work != last_work and now - since >= max(IDLE_STEPS_S, usual):
            watch.request()
            self._forward_mark = (steps, last_forwards, last_work, since, True)

    def _heartbeat(self) -> None:
        part = self.parts["heartbeat"]
        if not part.on:
            return
        try:
            from trainmedic.channel.wire import Heartbeat
            from trainmedic.probe.liveness import describe_frame, main_frame

            part.check()
            ident = self.state.worker_ident if self.role == "worker" else self.state.training_ident
            stack, modules, calls, op = describe_frame(
                main_frame(ident), HEARTBEAT_FRAMES, _short_name
            )
            samples = self.__dict__.get("_liveness")
            counts = samples[1].take() if samples is not None and samples[0] == self.pid else (0, 0)
            tracker = self.tracker
            self.outbox.append(
                Heartbeat(
                    pid=self.pid,
                    t=self.wall(),
                    steps=0 if tracker is None else tracker.train_steps,
                    phase="train" if tracker is None else tracker.phase,
                    activity="other" if tracker is None else tracker.activity,
                    stack=stack,
                    cpu_s=time.process_time(),
                    work=0 if tracker is None else tracker.work,
                    modules=modules,
                    calls=calls,
                    op=op,
                    samples=counts[0],
                    gil_busy=counts[1],
                    probe_tid=threading.get_native_id(),
                )
            )
        except Exception as exc:
            part.fail(exc)

    def _hello_line(self) -> bytes:
        from trainmedic.channel.wire import Hello, encode_message

        hello = Hello(
            pid=self.pid,
            ppid=os.getppid(),
            role=self.role,
            argv=tuple(str(a) for a in sys.argv),
            rank=self.rank,
            local_rank=self.local_rank,
            python=sys.version.split()[0],
            executable=sys.executable,
            t=self.started_at,
            node=os.uname().nodename,
            node_rank=_env_int("GROUP_RANK"),
            world_size=_env_int("WORLD_SIZE"),
        )
        return encode_message(hello, token=self.config.token)

    def _flush(self) -> None:
        """Send the outbox (hello first when due); on a broken channel, drop it.

        Consecutive steps go out as one ``steps`` line of rows."""
        from trainmedic.channel.client import ChannelClient
        from trainmedic.channel.wire import encode_message, encode_steps

        if self.client is None:
            self.client = ChannelClient(self.config.address)
        chunks: list[bytes] = []
        if self._hello_due:
            self._hello_due = False
            chunks.append(self._hello_line())
        outbox = self.outbox
        rows: list[list[Any]] = []
        train_s = wait_s = 0.0
        train_steps = 0
        while True:
            try:
                message = outbox.popleft()
            except IndexError:
                break
            try:
                if isinstance(message, tuple):
                    row = self._step_row(*message)
                    rows.append(row)
                    if row[8] == "train":  # phase; duration and data wait in columns 2, 3
                        train_s += row[2]
                        wait_s += row[3]
                        train_steps += 1
                    if len(rows) < BATCH_STEPS:
                        continue
                if rows:
                    chunks.append(encode_steps(self.pid, self.rank, rows))
                    rows = []
                    time.sleep(0)  # let a training thread waiting for the GIL have it
                if not isinstance(message, tuple):
                    chunks.append(encode_message(message))
            except Exception:
                rows = []
                continue  # one unencodable record must not stop the others
        if rows:
            try:
                chunks.append(encode_steps(self.pid, self.rank, rows))
            except Exception:
                rows = []  # unencodable (not expected: rows hold numbers and strings)
        if train_steps and self.step_stats is not None:
            self.step_stats.add(train_s, wait_s, train_steps)
        if not chunks:
            return
        if self.client.send(b"".join(chunks)):
            self._connected = True
        else:
            self.failed = True
            outbox.clear()
            self._go_quiet()

    def _go_quiet(self) -> None:
        """The supervisor is gone (its socket broke, e.g. it was killed): switch every
        part off, so each hook costs one attribute read and the job pays nothing more."""
        for part in self.parts.by_name.values():
            part.on = False
        sampler, self.sampler = self.sampler, None
        if sampler is not None:
            try:
                sampler.stop()
            except Exception:
                return  # its thread ends with the process anyway
