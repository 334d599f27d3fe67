"""The probe's background work: sending to the supervisor, heartbeats, what stacks to sample.

:class:`ProbeAgent` is the part of :class:`trainmedic.probe.runtime.Probe` that
runs on the probe's own thread (``trainmedic-probe``) and on the stack
sampler's: the training thread only appends to the outbox, and this thread
builds the step records from the queued drafts, sends them, sends a heartbeat
every :data:`HEARTBEAT_S` and asks the forward watch to look for new root
modules. It also says which threads the stack sampler
(:mod:`trainmedic.probe.sampling`) looks at, and when.

Every time this thread runs it takes the interpreter lock from a training
loop that runs Python much of its time, and the loop waits for it: what the
thread costs the job is about its whole CPU time plus the hand-overs, not a
share of the other core. So it runs as little as the supervisor needs:

* while the job makes progress (its work or step counts moved since the
  last look), once every :data:`STEADY_S` - the steps, the heartbeat and the
  rest in one pass;
* otherwise (start-up, a silence, a job the probe sees no work of) every
  :data:`FLUSH_S`, with a liveness sample at each pass (a ``time.sleep(0)``
  that times how long running Python code keeps the lock,
  :mod:`trainmedic.probe.liveness`). The sample forces a hand-over when the
  training thread runs Python, and what it tells (spinning in place or
  parked in native code) only matters during a silence, so a job making
  progress is not sampled.

Measured on a 12 s MLP job (``benchmarks/overhead_job.py``'s counts,
docs/performance.md): this thread's wake-ups fell from about 14.5 to 6 a
second.

Where the supervisor takes the probe's shared-memory ring
(:mod:`trainmedic.channel.ring`, offered with the hello), the training
thread writes each step there itself (:mod:`trainmedic.probe.steprings`),
and while the job makes progress this thread has nothing to do: it sleeps
on the connection for up to :data:`QUIET_S`, without a liveness sample at
its pass. It wakes early when the supervisor sees the ring stop
(:data:`~trainmedic.channel.wire.WAKE`: a silence, when heartbeats matter),
at a stack request, when CUDA comes up, and at exit. Messages the job queues
meanwhile (loader settings, events) wait for the next pass: none is needed
sooner while steps flow, and every one of them goes out once they stop.
"""

from __future__ import annotations

import os
import sys
import threading
import time

TYPE_CHECKING = False  # typing itself is not worth importing at the job's start-up
if TYPE_CHECKING:
    from collections import deque
    from collections.abc import Callable
    from typing import Any

    from trainmedic.channel.client import ChannelClient
    from trainmedic.channel.ring import RingWriter
    from trainmedic.channel.wire import ProbeMessage
    from trainmedic.probe.detail import DetailSwitch
    from trainmedic.probe.env import ProbeConfig
    from trainmedic.probe.liveness import ThreadSamples
    from trainmedic.probe.parts import Parts
    from trainmedic.probe.sampling import StackSampler, StepStats
    from trainmedic.probe.seams import ForwardSeam, HookState
    from trainmedic.probe.steprings import RingSteps
    from trainmedic.probe.steps import StepDraft, StepTracker

FLUSH_S = 0.25
"""Seconds between two passes of the probe's thread while the job shows no progress."""
STEADY_S = 1.0
"""Seconds between two passes while the job makes progress: step records reach the
supervisor up to this late (each carries its own time), events too."""
QUIET_S = 5.0
"""Seconds the probe's thread sleeps while steps flow through the ring and nothing
else is queued: its one routine pass (a heartbeat, the forward watch's routine look)."""
HEARTBEAT_S = 1.0
"""Seconds between two heartbeats."""
FIRST_CONNECT_DELAY_S = 0.2
"""The first connection waits this long (the hello then carries the final
``sys.argv``, and processes shorter than this with nothing to say send nothing)."""
IDLE_STEPS_S = 2.0
"""Seconds without a step (and at least 3 usual steps), the job working, after
which the probe's thread asks the forward watch to look for new root modules."""
HEARTBEAT_FRAMES = 6


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def job_rank() -> int | None:
    """This process's rank: ``RANK`` (torchrun, Slurm wrappers), else its place in
    TensorFlow's ``TF_CONFIG`` cluster (MultiWorkerMirroredStrategy: the chief first,
    then the workers in order; a parameter server or an evaluator has none)."""
    rank = _env_int("RANK")
    if rank is not None or "TF_CONFIG" not in os.environ:
        return rank
    import json  # only for jobs that set TF_CONFIG

    try:
        config = json.loads(os.environ["TF_CONFIG"])
        cluster, task = config.get("cluster") or {}, config.get("task") or {}
        kind, index = task.get("type"), int(task.get("index", 0))
    except (ValueError, TypeError, AttributeError):
        return None
    chiefs = len(cluster.get("chief") or ()) if isinstance(cluster, dict) else 0
    if kind == "chief":
        return index
    if kind == "worker":
        return chiefs + index
    return None


def _hooks_were_on(
    before: tuple[int, int, bool] | None, after: tuple[int, int, bool] | None
) -> bool:
    """Whether the compute hooks were on for the steps between two looks at
    :meth:`ProbeAgent._hook_state`: never switched off, a window ended in between,
    or on at both looks with no window begun between (still the same one)."""
    if before is None or after is None:
        return True
    if after[1] != before[1]:
        return True
    return before[2] and after[2] and after[0] == before[0]


def _short_name(filename: str) -> str:
    parts = filename.replace("\\", "/").rsplit("/", 2)
    return "/".join(parts[-2:])


class ProbeAgent:
    """The background threads' side of the probe (mixed into ``Probe``)."""

    # What this side reads of the probe (set by ``Probe.__init__``).
    config: ProbeConfig
    parts: Parts
    clock: Callable[[], float]
    wall: Callable[[], float]
    wall_offset: float
    started_at: float
    pid: int
    role: str
    rank: int | None
    local_rank: int | None
    state: HookState
    tracker: StepTracker | None
    forward: ForwardSeam | None
    detail: DetailSwitch | None
    step_stats: StepStats | None
    outbox: deque[ProbeMessage | StepDraft | tuple[StepDraft, Any, Any]]
    client: ChannelClient | None
    failed: bool
    sampler: StackSampler | None
    dump_requested: bool
    _stop: threading.Event
    _hello_due: bool
    _connected: bool
    _forward_mark: tuple[int, int, int, float, bool, tuple[int, int, bool] | None]
    _progress_seen: tuple[int, int] | None  # (work, steps) at the last pass
    _next_heartbeat: float  # time.monotonic() of the next heartbeat
    ring: RingSteps | None  # steps go to shared memory (the supervisor took the ring)
    _ring_offer: RingWriter | None  # offered with the hello, not yet answered
    quiet: bool  # the probe's thread sleeps on the connection (only then is it woken)
    stacks_outside: bool  # the supervisor samples the training thread's stacks itself
    _was_quiet: bool  # the last pass returned QUIET_S
    _wake_fds: tuple[int, int] | None  # the pipe that wakes a quiet thread

    _dump_stacks: Callable[[], None]  # ProbeIncidents
    emit: Callable[[ProbeMessage], None]  # Probe
    _send_cuda_info: Callable[[], None]  # Probe
    detail_failed: Callable[[BaseException], None]  # Probe

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
                policy = MainPolicy(
                    self.step_stats,
                    self._waiting_since,
                    self.clock,
                    self._train_steps,
                    pull=self._pull_ring_totals,
                )
            self.sampler = StackSampler(
                targets=self._stack_targets,
                emit=self.emit,
                on_error=part.fail,
                pid=self.pid,
                wall=self.wall,
                check=part.check,
                period=policy.period,
                standby=None if self.role == "worker" else self._sampled_outside,
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

    def _sampled_outside(self) -> bool:
        """Whether the supervisor samples what this sampler would (the training thread
        reads a DataLoader: its waits, and the pin-memory threads', are all it samples)."""
        return self.stacks_outside and self.state.loader_used

    def _pull_ring_totals(self) -> None:
        """Bring the stack sampler's step statistics up to date with the steps the
        training thread wrote into the ring (the sampler's thread calls this)."""
        ring, stats = self.ring, self.step_stats
        if ring is not None and stats is not None:
            duration, wait, steps = ring.take_totals()
            if steps:
                stats.add(duration, wait, steps)

    def _train_steps(self) -> int:
        tracker = self.tracker
        return 0 if tracker is None else tracker.train_steps

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

    def _agent_main(self) -> None:
        stop = self._stop
        if stop.wait(FIRST_CONNECT_DELAY_S) and not self.outbox:
            return
        try:
            while True:
                stopping = stop.is_set()
                wait = self._agent_pass(stopping)
                if stopping or self.failed:
                    return
                if wait >= QUIET_S:
                    self._quiet_wait(wait)
                else:
                    stop.wait(wait)
        except Exception:
            # The channel code itself failed (an interpreter shutting down, say):
            # stop reporting; the job goes on.
            self.failed = True
            self.outbox.clear()
            try:
                self._go_quiet()
            except Exception:
                return

    def _agent_pass(self, stopping: bool) -> float:
        """One pass of the probe's thread; returns the seconds until the next one:
        :data:`QUIET_S` when the job made progress since the last pass and its steps
        go through the ring, :data:`STEADY_S` when it made progress otherwise, else
        :data:`FLUSH_S` (and only then is the training thread sampled for liveness)."""
        if self._ring_offer is not None or self.ring is not None:
            self._read_supervisor()
        now = time.monotonic()
        seen, progress = self._progress_seen, self._progress()
        self._progress_seen = progress
        steady = seen is not None and progress is not None and progress != seen
        # Quiet only while steps flow: the supervisor wakes the thread when the ring
        # stops, and work without steps (an evaluation) needs its heartbeats each second.
        quiet = (
            steady
            and self.ring is not None
            and seen is not None
            and progress is not None
            and progress[1] != seen[1]
        )
        if not stopping and not steady:
            self._sample_main()
        if quiet and not self._was_quiet:
            # The last heartbeat for a while: the one that tells the supervisor this
            # process trains (its thread sampler reads training threads only).
            self._next_heartbeat = 0.0
        self._was_quiet = quiet
        if not stopping and now >= self._next_heartbeat:
            self._next_heartbeat = now + HEARTBEAT_S
            self._heartbeat(top_up=not quiet)
        if self.dump_requested:
            self.dump_requested = False
            self._dump_stacks()
        self._send_cuda_info()
        self._flush()
        if not stopping and not self.failed:
            self._watch_forward(now)
            self._wake_detail()
        if quiet:
            return QUIET_S
        return STEADY_S if steady else FLUSH_S

    # --- the quiet thread ------------------------------------------------------------------------

    def _quiet_wait(self, timeout: float) -> None:
        """Sleep on the connection and the wake pipe for up to ``timeout`` seconds."""
        import select  # here: the probe's thread, off the job's start-up

        client = self.client
        sock = None if client is None else client.fileno()
        fds = self._wake_pipe()
        if sock is None or fds is None:
            self._stop.wait(timeout)
            return
        self.quiet = True
        try:
            # Checked after ``quiet`` is set: whatever comes later wakes the pipe.
            if self.dump_requested or self._stop.is_set():
                return
            ready, _, _ = select.select([sock, fds[0]], [], [], timeout)
        finally:
            self.quiet = False
        if fds[0] in ready:
            try:
                while os.read(fds[0], 64):
                    pass
            except (BlockingIOError, InterruptedError):
                pass

    def _wake_pipe(self) -> tuple[int, int] | None:
        fds = self._wake_fds
        if fds is None:
            try:
                fds = self._wake_fds = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
            except (AttributeError, OSError):
                return None
        return fds

    def wake(self) -> None:
        """Wake the probe's thread if it sleeps quietly (any thread, a signal handler too)."""
        fds = self._wake_fds
        if fds is not None and self.quiet:
            try:  # noqa: SIM105 - plain try in a signal handler's path, no context manager
                os.write(fds[1], b"w")
            except OSError:
                pass  # full: it is being woken already

    def _read_supervisor(self) -> None:
        """Take in what the supervisor sent: its answer to the ring offer, wake-ups."""
        client = self.client
        data = None if client is None else client.receive()
        if data is None:
            return
        if not data:  # the supervisor closed the connection: it is gone
            self.failed = True
            self.outbox.clear()
            self._go_quiet()
            return
        from trainmedic.channel.wire import (
            RING_REFUSED,
            RING_TAKEN,
            STACKS_INSIDE,
            STACKS_OUTSIDE,
            WAKE,
        )

        offer = self._ring_offer
        if offer is not None and RING_TAKEN in data:
            from trainmedic.probe.steprings import RingSteps

            self._ring_offer = None
            self.ring = RingSteps(offer, self.wall_offset, self.outbox)
        elif offer is not None and RING_REFUSED in data:
            self._ring_offer = None
        outside, inside = data.rfind(STACKS_OUTSIDE), data.rfind(STACKS_INSIDE)
        if outside != inside:
            # The later word counts: the supervisor samples from outside, or no longer.
            self.stacks_outside = outside > inside and self.parts["outside_stacks"].on
            sampler = self.sampler
            if sampler is not None:
                sampler.wake()
        if WAKE in data:
            # The ring stopped: sample and send heartbeats as in any silence, from now.
            self._progress_seen = None
            self._next_heartbeat = 0.0

    def _offer_ring(self, hello: bytes) -> bool:
        """Send the hello with a new step ring when the channel can pass it; ``True``
        when it went (the answer comes later), ``False`` to send the hello as a line."""
        from trainmedic.channel import ring

        part = self.parts["ring"]
        client = self.client
        if (
            not part.on
            or client is None
            or self.role == "worker"  # DataLoader workers end no steps
            or not self.config.address.startswith("unix:")
            or not ring.available()
        ):
            return False
        try:
            part.check()
            writer = ring.RingWriter()
        except Exception as exc:
            part.fail(exc)
            return False
        assert writer.fd is not None
        sent = client.send_fd(hello, writer.fd)
        writer.close_fd()
        if sent:
            self._ring_offer = writer
            fd = client.fileno()
            if fd is not None and self.parts["outside_stacks"].on:
                # The supervisor samples a process with a ring from outside: where Yama
                # allows only ancestors, name it (its py-spy is no ancestor of the job).
                from trainmedic.probe.ptracer import allow_supervisor

                try:
                    allow_supervisor(fd)
                except Exception as exc:
                    self.parts["outside_stacks"].fail(exc)
        return sent

    def _progress(self) -> tuple[int, int] | None:
        """The training thread's (work, steps) counts; ``None`` without a step tracker."""
        tracker = self.tracker
        if tracker is None:
            return None
        return tracker.work, sum(tracker.steps_by_phase.values())

    def _sample_main(self) -> None:
        """One sample of the training thread for the next heartbeat
        (:mod:`trainmedic.probe.liveness`)."""
        if not self.parts["heartbeat"].on:
            return
        try:
            self._liveness_samples().sample()
        except Exception as exc:
            self.parts["heartbeat"].fail(exc)

    def _liveness_samples(self) -> ThreadSamples:
        """The samples counted towards this process's next heartbeat."""
        samples = self.__dict__.get("_liveness")
        if samples is None or samples[0] != self.pid:  # new, or inherited by a fork
            from trainmedic.probe.liveness import ThreadSamples

            samples = self.__dict__["_liveness"] = (self.pid, ThreadSamples())
        return samples[1]

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
        hooks = self._hook_state()
        last_steps, last_forwards, last_work, since, asked, last_hooks = self._forward_mark
        if steps != last_steps:
            self._forward_mark = (steps, forwards, work, now, False, hooks)
            # Forward calls are counted only while the compute hooks are on: steps
            # that all ran between two windows say nothing of the model's class.
            # (Asking then made a job of 5-20 ms steps rediscover every few seconds,
            # and each discovery changes ``nn.Module`` twice: see ForwardWatch.)
            unseen = forwards == last_forwards and _hooks_were_on(last_hooks, hooks)
            if unseen or self.clock() >= watch.next_routine:
                watch.request()
            return
        stats = self.step_stats
        usual = 3.0 * stats.step_s if stats is not None else 0.0
        if not asked and work != last_work and now - since >= max(IDLE_STEPS_S, usual):
            watch.request()
            self._forward_mark = (steps, last_forwards, last_work, since, True, last_hooks)

    def _hook_state(self) -> tuple[int, int, bool] | None:
        """(windows begun, windows ended, hooks on now) of the detail switch; ``None``
        when the compute hooks are never switched off."""
        detail = self.detail
        if detail is None or not detail.enabled:
            return None
        return detail.windows, detail.windows_ended, detail.on or detail.partly_on

    def _wake_detail(self) -> None:
        """Steps stopped while the compute hooks are off: put them back, so that
        whatever the job does now is seen (and counted as work) - docs/run.md."""
        detail = self.detail
        if detail is None or not detail.enabled or not detail.overdue(self.clock()):
            return
        try:
            detail.wake()
        except Exception as exc:
            self.detail_failed(exc)

    def _heartbeat(self, top_up: bool = True) -> None:
        """Queue a heartbeat; ``top_up``: take the liveness samples it needs (not while
        steps flow through the ring: the samples matter only in a silence)."""
        part = self.parts["heartbeat"]
        if not part.on:
            return
        try:
            from trainmedic.channel.wire import Heartbeat
            from trainmedic.probe.liveness import (
                HEARTBEAT_MIN_SAMPLES,
                describe_frame,
                main_frame,
            )

            part.check()
            ident = self.state.worker_ident if self.role == "worker" else self.state.training_ident
            stack, modules, calls, op = describe_frame(
                main_frame(ident), HEARTBEAT_FRAMES, _short_name
            )
            samples = self._liveness_samples()
            if top_up:
                samples.top_up(HEARTBEAT_MIN_SAMPLES)
            counts = samples.take()
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
                    sampler_tid=_sampler_tid(),
                )
            )
        except Exception as exc:
            part.fail(exc)

    def _hello_line(self, ring: bool = False) -> bytes:
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
            ring=ring,
        )
        return encode_message(hello, token=self.config.token)

    def _flush(self) -> None:
        """Send the outbox (hello first when due); on a broken channel, drop it.

        Consecutive steps go out as ``steps`` lines (:mod:`trainmedic.probe.steplines`)."""
        import contextlib  # here, not at the job's start-up: this runs on the probe's thread

        from trainmedic.channel.client import ChannelClient
        from trainmedic.channel.wire import encode_message
        from trainmedic.probe.segments import StepDraft
        from trainmedic.probe.steplines import StepLines

        if self.client is None:
            self.client = ChannelClient(self.config.address)
        chunks: list[bytes] = []
        if self._hello_due:
            self._hello_due = False
            if not self._offer_ring(self._hello_line(ring=True)):
                if self.client.failed is not None:
                    self.failed = True
                    self.outbox.clear()
                    self._go_quiet()
                    return
                chunks.append(self._hello_line())
        outbox = self.outbox
        steps = StepLines(self.pid, self.rank, self.wall_offset, chunks)
        while True:
            try:
                message = outbox.popleft()
            except IndexError:
                break
            try:
                if type(message) is StepDraft:  # a step without CUDA: queued bare
                    if steps.add(message, None, None):
                        time.sleep(0)  # let a training thread waiting for the GIL have it
                    continue
                if isinstance(message, tuple):
                    if steps.add(*message):
                        time.sleep(0)
                    continue
                steps.close()
                chunks.append(encode_message(message))
            except Exception:
                continue  # one unencodable record must not stop the others
        with contextlib.suppress(Exception):  # unencodable: not expected of numbers and strings
            steps.close()
        if steps.train_steps and self.step_stats is not None:
            self.step_stats.add(steps.train_s, steps.wait_s, steps.train_steps)
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
        self.ring = None
        sampler, self.sampler = self.sampler, None
        if sampler is not None:
            try:
                sampler.stop()
            except Exception:
                return  # its thread ends with the process anyway


def _sampler_tid() -> int | None:
    """The kernel thread id of this process's stack sampler (``trainmedic-stacks``)."""
    for t in threading.enumerate():
        if t.name == "trainmedic-stacks":
            return t.native_id
    return None
