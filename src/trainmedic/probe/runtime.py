"""The probe in one process of the job: its state, its lifecycle, what the hooks call.

:func:`activate` runs from the bootstrap ``sitecustomize`` when the
supervisor's environment variables are present. It must be cheap, since it
runs at every Python start-up of the job: it imports almost nothing, chains
the exception hooks, registers fork and exit handlers, starts one daemon
thread and waits for the job to import torch
(:mod:`trainmedic.probe.importhook`); only then are the torch hooks (and the
step tracker) loaded. The background thread loads the channel code itself,
off the job's start-up path.

The training thread never does I/O for the probe. Hooks update the step
tracker and append to an in-memory outbox; the background thread
(:mod:`trainmedic.probe.agent`) builds the records and sends the outbox every
:data:`~trainmedic.probe.agent.STEADY_S` while the job makes progress (every
:data:`~trainmedic.probe.agent.FLUSH_S` otherwise), and a heartbeat every
:data:`~trainmedic.probe.agent.HEARTBEAT_S`. At exit the rest is sent
synchronously. A process that ends before its first connection
(:data:`~trainmedic.probe.agent.FIRST_CONNECT_DELAY_S`) having nothing to say
sends nothing: short helper processes stay cheap. Exceptions and stack
requests are :mod:`trainmedic.probe.incidents`'.

A forked child (a DataLoader worker with the fork start method, or the job's
own ``multiprocessing``) inherits this object: the fork handler resets it so
the child reports as its own process, over its own connection.

Why one module of this length: it is the probe's one state object and its lifecycle
(activate, fork, exit), which must change together; the hooks, the agent and the
incidents it serves are modules of their own.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import time
from collections import deque

from trainmedic.probe.agent import ProbeAgent, _env_int, job_rank
from trainmedic.probe.env import ProbeConfig
from trainmedic.probe.importhook import when_imported
from trainmedic.probe.incidents import ProbeIncidents
from trainmedic.probe.parts import Part, Parts
from trainmedic.probe.seams import HookState
from trainmedic.record.events import EventKind

TYPE_CHECKING = False  # typing itself is not worth importing at the job's start-up
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import ModuleType
    from typing import Any

    from trainmedic.channel.client import ChannelClient
    from trainmedic.channel.ring import RingWriter
    from trainmedic.channel.wire import ProbeMessage, TorchInfo
    from trainmedic.probe.detail import DetailSwitch
    from trainmedic.probe.forensics import StackDumps
    from trainmedic.probe.keras_hooks import KerasSteps
    from trainmedic.probe.profile_window import ProfileWindow
    from trainmedic.probe.sampling import StackSampler, StepStats
    from trainmedic.probe.seams import ForwardSeam
    from trainmedic.probe.steprings import RingSteps
    from trainmedic.probe.steps import StepDraft, StepTracker
    from trainmedic.probe.tf_function_steps import FunctionSteps
    from trainmedic.probe.tf_pipelines import Pipelines
    from trainmedic.record.types import RunEvent

MAX_OUTBOX = 100_000
"""Messages kept while the supervisor is slow; more are counted and dropped."""
EXIT_JOIN_S = 2.0
"""Seconds the exit handler waits for the probe's thread to finish its last send."""


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


class Probe(ProbeAgent, ProbeIncidents):
    """Everything the probe knows and does in this process (its background side is
    :class:`~trainmedic.probe.agent.ProbeAgent`, its incidents side
    :class:`~trainmedic.probe.incidents.ProbeIncidents`)."""

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
        self.rank = job_rank()
        self.local_rank = _env_int("LOCAL_RANK")
        self.parts = Parts(config.disabled, config.inject_fault, self._report_part_error)
        self.state = HookState(training_ident=threading.main_thread().ident)
        self.tracker: StepTracker | None = None
        self.forward: ForwardSeam | None = None
        self.detail: DetailSwitch | None = None
        self.step_stats: StepStats | None = None
        self.cuda: Any = None
        self.profile_window: ProfileWindow | None = None
        self.torch: ModuleType | None = None
        self.keras: KerasSteps | None = None
        self.tf_pipelines: Pipelines | None = None
        self.tf_functions: FunctionSteps | None = None
        self.restore: list[Callable[[], None]] = []
        # Messages, and finished steps as (draft, timing, alloc) to build records from.
        self.outbox: deque[ProbeMessage | StepDraft | tuple[StepDraft, Any, Any]] = deque()
        self.dropped = 0
        self.client: ChannelClient | None = None
        # The channel broke: queue nothing more. Without "sending" nothing is queued and
        # no thread of the probe runs from the start: what the hooks alone cost a job
        # (benchmarks/overhead.py --split); the run records no steps.
        self.failed = not self.parts["sending"].on
        self.sampler: StackSampler | None = None
        # Steps go to shared memory once the supervisor took the ring (probe.agent).
        self.ring: RingSteps | None = None
        self._ring_offer: RingWriter | None = None
        self.quiet = False
        self._was_quiet = False
        # The supervisor samples this process's stacks from outside (channel.wire).
        self.stacks_outside = False
        self._wake_fds: tuple[int, int] | None = None
        self._stop = threading.Event()
        self._agent: threading.Thread | None = None
        self._agent_lock = threading.Lock()
        self._hello_due = True
        self._connected = False
        self._finished = False
        # (steps, forward calls, work, since when, discovery asked) as the agent last saw them.
        self._forward_mark: tuple[int, int, int, float, bool, tuple[int, int, bool] | None] = (
            0, 0, 0, 0.0, False, None
        )
        self._progress_seen: tuple[int, int] | None = None
        self._next_heartbeat = 0.0
        # Set by the stack signal's handler, read by the agent (no lock: see forensics).
        self.dump_requested = False
        self.stack_dumps: StackDumps | None = None
        # The job initialised CUDA: a TorchInfo with its devices is due (_send_cuda_info).
        self._cuda_info_due = False

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
        when_imported("tensorflow", self._on_tensorflow)
        when_imported("keras", self._on_keras)
        when_imported("tf_keras", self._on_tf_keras)

    def _ensure_agent(self) -> None:
        if self._agent is not None or not self.parts["sending"].on:
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
        self.failed = not self.parts["sending"].on
        self.outbox = deque()
        self.dropped = 0
        # The parent's ring and wake pipe are the parent's: this process gets its own.
        self.ring = None
        self._ring_offer = None
        self.quiet = False
        self._was_quiet = False
        self.stacks_outside = False
        fds, self._wake_fds = self._wake_fds, None
        for fd in fds or ():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._stop = threading.Event()
        self._agent = None
        self._agent_lock = threading.Lock()
        self._hello_due = True
        self._connected = False
        self._finished = False
        self.dump_requested = False
        self._cuda_info_due = False
        self._progress_seen = None
        self._next_heartbeat = 0.0
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
        if self.profile_window is not None:
            self.profile_window.abandon()

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
        window = self.profile_window
        if window is not None and self.parts["profiler"].on:
            try:
                window.finish()  # its event goes out with the rest
            except Exception as exc:
                self._profile_failed(exc)
        # Read before the threads end: a thread's CPU clock goes with it.
        cpu_s = self._threads_cpu_s()
        if self.sampler is not None:
            self.sampler.stop()
        self._stop.set()
        self.wake()
        agent = self._agent
        if agent is not None and agent.is_alive() and agent is not threading.current_thread():
            agent.join(EXIT_JOIN_S)
            if agent.is_alive():
                return  # the agent is stuck in a send; don't race it on the socket
        self._send_cuda_info()
        if not self._connected and not self.outbox:
            return  # a short process with nothing to say: no connection at all
        from trainmedic.channel.wire import Goodbye

        if self.dropped:
            self.emit(
                self.event(
                    EventKind.PROBE_DROPPED,
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

    # --- torch -----------------------------------------------------------------------------------

    def _on_torch(self, torch: ModuleType) -> None:
        try:
            self._install_torch(torch)
        except Exception as exc:
            self.parts["steps"].fail(exc)

    def _on_tensorflow(self, tf: ModuleType) -> None:
        try:
            from trainmedic.probe import keras_hooks

            keras_hooks.install_tensorflow(tf, self)
        except Exception as exc:
            self.parts["keras"].fail(exc)

    def _on_keras(self, keras: ModuleType) -> None:
        try:
            from trainmedic.probe import keras_hooks

            keras_hooks.install(keras, self)
        except Exception as exc:
            self.parts["keras"].fail(exc)

    def _on_tf_keras(self, tf_keras: ModuleType) -> None:
        try:
            from trainmedic.probe import keras_hooks

            keras_hooks.install(tf_keras, self, keras_hooks.TF_KERAS)
        except Exception as exc:
            self.parts["keras"].fail(exc)

    def ensure_tracker(self) -> StepTracker:
        """The step tracker, made on first use (torch's, Keras's and the API's alike)."""
        return self._ensure_tracker()

    def _ensure_tracker(self) -> StepTracker:
        if self.tracker is None:
            from trainmedic.probe.steps import StepTracker

            self.tracker = StepTracker(emit=self._on_draft)
        return self.tracker

    def _install_torch(self, torch: ModuleType) -> None:
        from trainmedic.probe import torch_features, torch_hooks
        from trainmedic.probe.cuda import CudaSteps
        from trainmedic.probe.sampling import StepStats

        self.torch = torch
        version = str(getattr(torch, "__version__", "unknown"))
        gaps = torch_features.find_gaps(torch)
        parts_off = torch_features.switch_off(gaps, self.parts, version)
        if gaps or torch_features.too_old(version):
            message, data = torch_features.degraded_event_data(version, gaps, parts_off)
            self.emit(self.event(EventKind.PROBE_DEGRADED, message, data))
        tracker = self._ensure_tracker()
        if self.step_stats is None:
            self.step_stats = StepStats()
        # A CPU-only build of torch never initialises CUDA: no CUDA part at all.
        if self.parts["cuda"].on and getattr(torch.version, "cuda", None):
            self.cuda = CudaSteps(torch, self.parts["cuda"], self._finish_step, self._cuda_ready)
            tracker.listener = self.cuda
        from trainmedic.probe.detail import DetailSwitch

        self.detail = DetailSwitch(tracker, enabled=self.parts["sampled_detail"].on)
        torch_hooks.install(torch, self, tracker, frozenset(g.feature for g in gaps))
        self.detail.forward = self.forward
        self._install_profile_window(torch)
        if os.environ.get("TRAINMEDIC_APPLY"):  # trainmedic run --apply-from
            from trainmedic.probe import apply  # never raises: its errors become events

            apply.install(torch, self)
        self.emit(self._torch_info(torch, cuda_ready=False))

    def _install_profile_window(self, torch: ModuleType) -> None:
        """The profiler windows (:mod:`trainmedic.probe.profile_window`), where they apply:
        a run directory to write to, the part on, and CUDA in this build of torch unless
        ``always`` was asked for."""
        from trainmedic.probe.env import PROFILE
        from trainmedic.probe.profile_window import ProfileWindow

        mode = os.environ.get(PROFILE, "auto")
        part = self.parts["profiler"]
        if mode not in ("auto", "always") or not part.on or self.config.run_dir is None:
            return
        cuda = self.cuda
        if mode == "auto" and cuda is None:
            return  # a CPU-only build: no GPU to learn about
        name = f"pid{self.pid}" + (f"-rank{self.rank}" if self.rank is not None else "")
        self.profile_window = ProfileWindow(
            torch,
            part,
            self.config.run_dir,
            name,
            uses_cuda=(lambda: cuda.active()) if cuda is not None else (lambda: False),
            capturing=(lambda: cuda.capturing()) if cuda is not None else (lambda: False),
            send_event=lambda kind, message, data: self.emit(self.event(kind, message, data)),
            mode=mode,
        )

    def _profile_failed(self, exc: BaseException) -> None:
        window = self.profile_window
        self.profile_window = None
        self.parts["profiler"].fail(exc)
        if window is not None:
            window.stop_quietly()

    def _torch_info(self, torch: Any, cuda_ready: bool) -> TorchInfo:
        from trainmedic.channel.wire import TorchInfo

        devices: tuple[str, ...] = ()
        arch: tuple[str, ...] = ()
        cudnn: int | None = None
        if cuda_ready:
            cuda = torch.cuda
            devices = tuple(str(cuda.get_device_name(i)) for i in range(cuda.device_count()))
            arch = tuple(str(a) for a in cuda.get_arch_list())
            try:
                version = torch.backends.cudnn.version()  # the first call loads cuDNN
            except Exception:
                version = None  # its compatibility check failed: the job meets it at its first use
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
        # Called inside the job's first step on CUDA (trainmedic.probe.cuda), perhaps
        # while dynamo traces it: nothing is read here, the probe's thread does it.
        self._cuda_info_due = True
        self.wake()

    def _send_cuda_info(self) -> None:
        """Queue the TorchInfo of a job that initialised CUDA (devices, architectures,
        cuDNN), once; on the probe's thread or at exit, outside the job's steps.

        The first ``torch.backends.cudnn.version()`` loads and checks cuDNN: inside a
        step it would lengthen that step, and could land in a CUDA graph capture or a
        region dynamo traces. During a capture that the graph wrapper saw begin
        (``torch.cuda.graph``, CUDA graph trees) it waits for the next round."""
        if not self._cuda_info_due:
            return
        cuda = self.cuda
        if cuda is not None and cuda.captures:
            return
        self._cuda_info_due = False
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
        detail = self.detail
        if detail is not None:
            try:
                detail.step_ended(draft)
            except Exception as exc:
                self.detail_failed(exc)
        window = self.profile_window
        if window is not None:
            try:
                window.step_ended(draft)
            except Exception as exc:
                self._profile_failed(exc)
        ring = self.ring
        if self.cuda is not None:
            self.cuda.add(draft)
        elif ring is not None:
            ring.append(draft)
            if not self.state.loader_used and self.sampler is None:
                self.step_marked()
        elif not self.failed and len(self.outbox) < MAX_OUTBOX:
            self.outbox.append(draft)  # no CUDA timing to pair with it: no tuple to make
            if not self.state.loader_used and self.sampler is None:
                self.step_marked()
        elif not self.failed:
            self.dropped += 1
        if detail is not None and not detail.on and window is None and not self.failed:
            try:  # the next steps of a gap end in the tracker alone (probe.steps.GapSteps)
                if ring is None:
                    detail.arm_gap(self.outbox, MAX_OUTBOX)
                else:
                    detail.arm_gap(ring, MAX_OUTBOX, ring.gap)
            except Exception as exc:
                self.detail_failed(exc)

    def _finish_step(self, draft: StepDraft, timing: Any, alloc: Any) -> None:
        # Into the ring, or queued for the background thread to build the record.
        ring = self.ring
        if ring is not None:
            ring.add(draft, timing, alloc)
            if not self.state.loader_used and self.sampler is None:
                self.step_marked()
        elif not self.failed and len(self.outbox) < MAX_OUTBOX:
            self.outbox.append((draft, timing, alloc))
            if not self.state.loader_used and self.sampler is None:
                self.step_marked()
        elif not self.failed:
            self.dropped += 1

    def detail_failed(self, exc: BaseException) -> None:
        """The detail switch failed: every compute hook back on, for good."""
        self.parts["sampled_detail"].fail(exc)
        detail = self.detail
        if detail is not None:
            detail.enabled = False
            try:
                detail.restore()
            except Exception as again:
                self.parts["forward"].fail(again)  # hooks in an unknown state: stop timing them

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
            self.detail = None  # a worker ends no steps: nothing to switch
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

    # --- errors ----------------------------------------------------------------------------------

    def event(self, kind: EventKind, message: str, data: dict[str, Any]) -> RunEvent:
        """A run event of this process, timed now."""
        from trainmedic.record.types import RunEvent

        return RunEvent(t=self.wall(), kind=kind, message=message, pid=self.pid, data=data)

    def _report_part_error(self, part: Part, exc: BaseException, tb: str) -> None:
        self.emit(
            self.event(
                EventKind.PROBE_ERROR,
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
