"""Waits on other threads and processes, followed to the ones doing the work.

A loop without a DataLoader that takes its batches from a thread pool, a
prefetch thread, producer processes or an event loop elsewhere shows only a
wait in its own stack (``ipc_wait``). What that wait costs is what the others
do meanwhile: the probe samples them while the training thread waits
(:mod:`trainmedic.probe.handoff`; each record's ``handoff`` counts). Here
those observations become a :class:`Handoff`: which resource the helpers
wait on or compute with, how many requests they keep in flight, and from
that, by Little's law, how many must be in flight to keep up with the step:

* in flight now while the loop waits: ``L = in_flight / waits`` (a thread
  blocked on a socket or a file is one request; an event loop polling its
  connections holds one per connection);
* per-sample latency ``W`` between ``L x wait per step / samples per step``
  (the helpers idle while the step computes: a pool the loop feeds as it asks)
  and ``L x step / samples per step`` (busy throughout: a prefetch thread or
  producers that never get ahead); the samples are taken during the wait only,
  so the larger one sizes the fix;
* needed: ``1.25 x rate x W`` with ``rate = samples per step / compute time``,
  that is ``1.25 x L x step / compute`` - however many cores there are: a
  request waiting on the network holds a slot, not a CPU;
* the helpers' CPU per step (``python``: Python code, at most one core for all
  of a process's threads, the interpreter lock; ``cpu``: native code or a
  process computing), from the upper end of its sampled share (so that none
  seen is not taken for none spent), bounds what more requests in flight can
  gain: the step becomes the slower of its compute and that CPU on the cores it
  may use.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from trainmedic.diagnose.data_wait import data_wait
from trainmedic.diagnose.sampled import SampledShare, sampled
from trainmedic.diagnose.servers import ServerLooks
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category
from trainmedic.record.sample_states import (
    BUSY_HELPER_STATES,
    DELIVERED,
    IN_FLIGHT,
    PROCESS_PREFIX,
    THREAD_PREFIX,
    WAITS,
)

RESOURCES: dict[str, tuple[str, ...]] = {
    "network": ("socket", "poll"),
    "io": ("file",),
    "cpu": ("python", "cpu"),
}
"""Each resource and the helper states that show it. An event loop polling its
descriptors (``poll``) waits on its requests: the network."""
CATEGORY = {"network": Category.NETWORK, "io": Category.IO, "cpu": Category.CPU}
IN_FLIGHT_MARGIN = 1.25
"""Requests in flight beyond the bare need, for the jitter of latencies."""
MAX_THREADS = 256
"""Most fetch threads advised in one process; more in flight: asyncio or processes."""


@dataclass(frozen=True)
class Handoff:
    """What the threads and processes the loop waited on did, over the steady part.

    Attributes:
        outside_samples: the training thread's samples between steps.
        waits: of them, samples that waited on other threads or processes and looked at
            them (every average "at a moment of the wait" is over these).
        threads / processes: observations of helper threads / child processes by state.
        in_flight: requests in flight summed over the observations waiting on I/O.
        frames: the helpers' most frequent frames while they worked.
        server: looks at the processes of this machine at the far end of the helpers'
            sockets (:mod:`trainmedic.diagnose.servers`).
        answered: samples that waited on others whose wait was already answered with
            no helper working, their observations not counted
            (:mod:`trainmedic.probe.answered`).
    """

    outside_samples: int
    waits: int
    threads: Counter[str]
    processes: Counter[str]
    in_flight: float
    frames: Counter[str] = field(default_factory=Counter)
    server: ServerLooks = field(default_factory=ServerLooks)
    answered: int = 0

    @property
    def wait_samples(self) -> int:
        """Samples of the loop that waited on others, answered or not."""
        return self.waits + self.answered

    @property
    def observations(self) -> Counter[str]:
        return self.threads + self.processes

    @property
    def busy(self) -> int:
        obs = self.observations
        return sum(obs[s] for s in BUSY_HELPER_STATES)

    def wait_share(self, th: Thresholds) -> SampledShare:
        """Share of the loop's samples between steps that waited on others."""
        return sampled(self.wait_samples, self.outside_samples, th)

    def busy_share(self, th: Thresholds) -> SampledShare:
        """Share of the helpers' observations that worked (not idle, not blocked elsewhere),
        over as many samples as there were moments (a moment's observations go together)."""
        total = sum(self.observations.values())
        return _weighted(self.busy, total, self.waits, th)

    def resource_share(self, resource: str, th: Thresholds) -> SampledShare:
        """Share of the busy observations showing ``resource`` (:data:`RESOURCES`)."""
        obs = self.observations
        hits = sum(obs[s] for s in RESOURCES[resource])
        return _weighted(hits, self.busy, self.waits, th)

    def resource(self, th: Thresholds) -> str | None:
        """The resource the helpers' work goes to, when the samples settle it: its share of
        their busy observations is at least ``activity_dominant_share`` for sure."""
        if not self.settled(th):
            return None
        top = max(RESOURCES, key=lambda r: self.resource_share(r, th).share)
        return top if self.resource_share(top, th).versus(th.activity_dominant_share) else None

    def settled(self, th: Thresholds) -> bool:
        """Enough moments sampled, and enough of the helpers' observations working, to say
        what the wait goes to."""
        return self.waits >= th.activity_min_samples and self.busy >= th.activity_min_samples

    @property
    def in_flight_now(self) -> float:
        """Requests in flight while the loop waited, on average."""
        return self.in_flight / self.waits if self.waits else 0.0

    @property
    def python_per_wait(self) -> float:
        """Helper threads in Python code at a moment of the wait, on average."""
        return self.threads["python"] / self.waits if self.waits else 0.0

    @property
    def where(self) -> str:
        """``threads``, ``processes`` or ``threads and processes``: who did the work."""
        t = sum(self.threads[s] for s in BUSY_HELPER_STATES)
        p = sum(self.processes[s] for s in BUSY_HELPER_STATES)
        if t and p:
            return "threads" if t >= 3 * p else "processes" if p >= 3 * t else "both"
        return "processes" if p else "threads"

    @property
    def event_loop(self) -> bool:
        """The waiting is done by an event loop polling (asyncio), not blocked threads."""
        obs = self.observations
        # One blocked thread or process is one request; more in flight than that are an
        # event loop's connections.
        return obs["poll"] > 0 or obs["socket"] + obs["file"] < self.in_flight


def _weighted(hits: float, total: float, moments: int, th: Thresholds) -> SampledShare:
    """``hits`` of ``total`` observations as a share judged over ``moments`` samples."""
    if total <= 0:
        return sampled(0, 0, th)
    n = min(total, moments)
    return sampled(hits / total * n, n, th)


def measure_handoff(view: RunView, th: Thresholds) -> Handoff | None:
    """The run's :class:`Handoff` over the processes without a DataLoader; ``None`` when
    their training threads never waited on others."""
    pids = frozenset(a.pid for a in view.record.loader_activity) - view.loader_pids
    threads: Counter[str] = Counter()
    processes: Counter[str] = Counter()
    frames: Counter[str] = Counter()
    server = ServerLooks()
    waits = outside = answered = 0
    in_flight = 0.0
    # The whole run, as the loop's own samples are counted (:meth:`RunView.outside_activity`).
    for a in view.record.loader_activity:
        if a.pid not in pids:
            continue
        outside += sum(v for v in a.counts.values() if v > 0)
        if not a.handoff:
            continue
        waits += a.handoff.get(WAITS, 0)
        answered += a.handoff.get(DELIVERED, 0)
        in_flight += a.handoff.get(IN_FLIGHT, 0)
        for key, n in a.handoff.items():
            if key.startswith(THREAD_PREFIX):
                threads[key[len(THREAD_PREFIX) :]] += n
            elif key.startswith(PROCESS_PREFIX):
                processes[key[len(PROCESS_PREFIX) :]] += n
        server = server.add(a.handoff)
        frames.update(a.helper_frames)
    if waits <= 0:
        return None
    return Handoff(
        outside, waits - answered, threads, processes, in_flight, frames, server, answered
    )


@dataclass(frozen=True)
class HandoffSizing:
    """How much the helpers must do to keep up with the step, and what that gains.

    Attributes:
        step_s / wait_s / compute_s: mean steady step, its wait on the helpers, the rest.
        samples_per_step: samples in a step's batch (``None``: not measured).
        in_flight_now: requests in flight while the loop waits.
        in_flight_needed: requests in flight that keep up with the step (Little's law).
        latency_s: per-sample latency, the larger estimate (``None`` without samples
            per step); ``latency_low_s`` the smaller.
        cpu_s: the helpers' CPU per step, seconds (upper end of its sampled share).
        python: that CPU is Python code in threads (one interpreter lock for all).
        capacity_cores: cores that CPU may use once the fix is in (1 under the lock).
        new_step_s / speedup: the predicted step and speed-up.
        limited_by: what bounds the predicted step: ``compute`` (the step's own),
            ``cpu`` (the helpers' CPU on the cores), ``gil`` (their Python on one core),
            ``server`` (the CPU of a data server they wait on).
    """

    step_s: float
    wait_s: float
    compute_s: float
    samples_per_step: float | None
    in_flight_now: float
    in_flight_needed: int
    latency_s: float | None
    latency_low_s: float | None
    cpu_s: float
    python: bool
    capacity_cores: float
    new_step_s: float
    speedup: float
    limited_by: str

    @property
    def rate_needed(self) -> float | None:
        """Samples per second the step consumes without waiting."""
        if self.samples_per_step is None:
            return None
        return self.samples_per_step / self.compute_s

    @property
    def multiplier(self) -> float:
        """How many times the requests in flight now must become."""
        return IN_FLIGHT_MARGIN * self.step_s / self.compute_s


def size_handoff(
    view: RunView, th: Thresholds, h: Handoff, *, processes_fix: bool = False
) -> HandoffSizing | None:
    """The sizing of the fix; ``processes_fix``: the helpers' CPU would run in processes
    (the fix for Python threads held by the interpreter lock). ``None`` without steps."""
    s = view.summary
    step = s.step_time_mean_s
    if step is None or step <= 0 or s.steps_steady <= 0:
        return None
    wait = data_wait(view, th)
    wait_s = min(step, wait.ordinary_s * (wait.data_share or 0.0) / s.steps_steady)
    compute = max(1e-6, step - wait_s)
    obs = h.observations
    total = sum(obs.values())
    per_wait = total / h.waits if h.waits else 0.0
    # The helpers' CPU per step: their computing observations at a moment of the wait,
    # x the wait. Threads in Python run one at a time: at most one core of it.
    computing = h.threads["python"] + obs["cpu"]
    compute_hi = _weighted(computing, total, h.waits, th).high * per_wait
    python = h.threads["python"] >= obs["cpu"] and h.threads["python"] > 0
    python_part = h.threads["python"] / computing if computing else 0.0
    # Threads in Python run one at a time: however many wait for the lock, one core works.
    busy_cores = min(compute_hi * python_part, 1.0) + compute_hi * (1.0 - python_part)
    cpu_s = busy_cores * wait_s
    cores = view.usable_cores or 4.0
    others = view.summary.others_cpu_mean_cores or 0.0
    room = max(0.5, cores - others)
    if processes_fix or not python:
        capacity, limit = room, "cpu"
    else:
        capacity, limit = 1.0, "gil"  # one interpreter lock, one core, whatever the cores
    # The helpers' CPU on the cores it may use; and all of the step's CPU (theirs, and the
    # training thread's compute on a CPU-only run) on the cores there are.
    helpers_step = cpu_s / max(capacity, 1e-6)
    if processes_fix:
        helpers_step += th.worker_handoff_s
    own = compute if view.uses_gpu is not True else 0.0
    new_step = max(compute, helpers_step, (cpu_s + own) / room)
    limited_by = "compute" if new_step <= compute * 1.0001 else limit
    samples = s.samples_per_step_mean
    if samples is None:
        sizes = [lo.batch_size for lo in view.train_loaders if lo.batch_size]
        samples = float(min(sizes)) if sizes else None
    now = h.in_flight_now
    latency = now * step / samples if samples else None
    latency_low = now * wait_s / samples if samples else None
    needed = max(1, math.ceil(IN_FLIGHT_MARGIN * now * step / compute)) if now > 0 else 0
    return HandoffSizing(
        step_s=step,
        wait_s=wait_s,
        compute_s=compute,
        samples_per_step=samples,
        in_flight_now=now,
        in_flight_needed=needed,
        latency_s=latency,
        latency_low_s=latency_low,
        cpu_s=cpu_s,
        python=python,
        capacity_cores=capacity,
        new_step_s=new_step,
        speedup=max(1.0, step / new_step),
        limited_by=limited_by,
    )
