"""How much parallel loading a job needs, sized from what one sample costs.

Loading one sample takes ``fetch`` seconds of a loader's time (a DataLoader
worker, or the training thread itself with ``num_workers=0``); part of it
waits on a file or a socket (``latency``), the rest computes (decoding,
transforms). To never wait for data, the loaders must deliver the samples of
one step while the step computes: ``rate = samples per step / compute time``
samples per second. By Little's law, that takes ``rate x fetch`` samples in
flight at any moment — however many cores the machine has, because a sample
that waits on the network holds a slot but no CPU. The CPU part alone needs
``rate x (fetch - latency)`` cores, and that is what cores bound: the
process's cores carry the loading's CPU and the step's own CPU (the training
thread and its helper threads), so a step can be no shorter than all of its
CPU work spread over them.

So latency-bound loading gets as many samples in flight as the latency asks
for — in threads (or async I/O) inside a few worker processes when more
processes than cores would be needed, since each process costs memory and
start-up and does nothing but wait — and CPU-bound loading gets workers up to
the cores it can use. The predicted step is the slower of the compute and
what the loaders can then deliver; where the advice brings worker processes
in, the compute grows by what receiving each batch from a worker costs the
training process (``Thresholds.worker_handoff_s``): a batch cheaper to build
than that gains nothing from workers.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

#: samples in flight beyond the bare need, for the jitter of latencies.
IN_FLIGHT_MARGIN = 1.25
#: a predicted speed-up under this is no gain: the fix is not worth giving.
MIN_GAIN = 1.05
#: more threads than this per worker process buy little and cost memory.
MAX_THREADS_PER_WORKER = 64
WAIT_STATES = ("file_read", "socket_wait")


@dataclass(frozen=True)
class LoadingProfile:
    """What loading costs one training process, measured.

    Attributes:
        samples_per_step: samples in one step's batch.
        step_s: mean steady step, seconds.
        wait_s: mean ordinary data wait per step (stalls excluded), seconds.
        workers: DataLoader workers per process (0: the training thread loads).
        fetch_s: loader time one sample takes, seconds.
        latency_share: share of ``fetch_s`` waiting on files or sockets, 0..1.
        cores: cores this process's loading and compute share (the usable
            cores, per process).
        handoff_s: what the step pays per batch for receiving it from a worker
            process, when the advice brings workers in (0 where they are there).
        useful_cores: the job's useful CPU, per process, cores (``None``: not
            measured); less the loading's, it is the step's own CPU.
    """

    samples_per_step: float
    step_s: float
    wait_s: float
    workers: int
    fetch_s: float
    latency_share: float
    cores: float
    handoff_s: float = 0.0
    useful_cores: float | None = None

    @property
    def compute_s(self) -> float:
        """The step without waiting for data, seconds."""
        return max(1e-6, self.step_s - self.wait_s)

    @property
    def cpu_per_sample_s(self) -> float:
        """The CPU part of loading one sample, seconds."""
        return self.fetch_s * (1.0 - self.latency_share)

    @property
    def compute_cpu_s(self) -> float:
        """The step's own CPU (training and helper threads), per step, seconds.

        The job's useful CPU less the loading's; unmeasured, one core through the
        compute (the most a single training thread takes).
        """
        if self.useful_cores is None:
            return self.compute_s
        own = self.useful_cores * self.step_s - self.samples_per_step * self.cpu_per_sample_s
        return min(max(0.0, own), max(1.0, self.cores) * self.compute_s)


@dataclass(frozen=True)
class LoadingAdvice:
    """Parallel loading that keeps up with the step.

    Attributes:
        samples_per_s: samples per second the step consumes without waiting.
        in_flight: samples that must be loading at once.
        cores_needed: cores the loading's CPU part takes at that rate.
        num_workers: worker processes to use.
        threads_per_worker: threads fetching inside each (1: plain workers).
        speedup: predicted steady speed-up, x.
        new_step_s: predicted step, seconds.
        latency_bound: more samples must be in flight than processes fit the cores.
        limited_by: what bounds the predicted step: ``compute`` (the step itself),
            ``cores`` (the loading's CPU on the cores it may use), ``handoff`` (the
            per-batch cost of receiving batches from workers).
    """

    samples_per_s: float
    in_flight: int
    cores_needed: float
    num_workers: int
    threads_per_worker: int
    speedup: float
    new_step_s: float
    latency_bound: bool
    limited_by: str = "compute"

    def evidence(self, profile: LoadingProfile) -> dict[str, float | int | str | bool]:
        return {
            "sample_fetch_ms": round(profile.fetch_s * 1000, 3),
            "sample_latency_ms": round(profile.fetch_s * profile.latency_share * 1000, 3),
            "samples_per_s_needed": round(self.samples_per_s, 1),
            "samples_in_flight_needed": self.in_flight,
            "loading_cores_needed": round(self.cores_needed, 2),
            "recommended_num_workers": self.num_workers,
            "recommended_threads_per_worker": self.threads_per_worker,
            "predicted_speedup": round(self.speedup, 2),
            "predicted_step_s": round(self.new_step_s, 4),
            "speedup_limited_by": self.limited_by,
            "latency_bound": self.latency_bound,
        }


def fetch_time_s(
    *,
    workers: int,
    samples_per_step: float,
    step_s: float,
    wait_s: float,
    worker_activity: Counter[str],
) -> float | None:
    """Loader time per sample, seconds.

    With no workers the training thread loads while it waits: the wait per
    sample. With workers, each one delivers ``samples/s / workers`` while busy
    for the share of its stack samples that are not idle.
    """
    if samples_per_step <= 0 or step_s <= 0:
        return None
    if workers == 0:
        return wait_s / samples_per_step if wait_s > 0 else None
    busy = sum(n for state, n in worker_activity.items() if state not in ("idle", "ipc_wait"))
    idle = worker_activity.get("idle", 0)
    if busy + idle <= 0:
        return None
    busy_share = busy / (busy + idle)
    rate = samples_per_step / step_s  # samples per second of this process
    return busy_share * workers / rate


def latency_share(activity: Counter[str]) -> float:
    """Share of the loaders' busy stack samples waiting on files or sockets."""
    busy = sum(n for state, n in activity.items() if state not in ("idle", "ipc_wait"))
    waiting = sum(activity.get(s, 0) for s in WAIT_STATES)
    return waiting / busy if busy else 0.0


def advise(profile: LoadingProfile, max_processes: int) -> LoadingAdvice:
    """Workers and threads that keep up with the step, and the speed-up they buy.

    Args:
        max_processes: most worker processes the cores justify (each busy one
            needs a core; idle ones waste memory).
    """
    rate = profile.samples_per_step / profile.compute_s
    in_flight = max(1, math.ceil(IN_FLIGHT_MARGIN * rate * profile.fetch_s))
    cpu_per_sample = profile.cpu_per_sample_s
    cores_needed = rate * cpu_per_sample
    cores = max(0.5, profile.cores)
    # What the loaders can deliver: all the step needs, unless the step's CPU work,
    # the loading's and its own, needs more cores than there are.
    floor = profile.compute_s + profile.handoff_s
    cpu_work = profile.samples_per_step * cpu_per_sample + profile.compute_cpu_s
    loading = profile.compute_s if cpu_per_sample <= 0 else cpu_work / cores
    new_step = max(floor, loading)
    speedup = max(1.0, profile.step_s / new_step)
    if loading > floor:
        limited_by = "cores"
    elif profile.handoff_s > 0 and floor > profile.compute_s * 1.05:
        limited_by = "handoff"
    else:
        limited_by = "compute"

    cpu_workers = max(1, min(max_processes, math.ceil(cores_needed * IN_FLIGHT_MARGIN)))
    # Latency-bound: the samples waiting on files or sockets alone need more slots than
    # processes fit the cores. Loading that computes needs cores, which threads are not.
    waiting = math.ceil(IN_FLIGHT_MARGIN * rate * profile.fetch_s * profile.latency_share)
    latency_bound = waiting > max(max_processes, cpu_workers)
    if latency_bound:
        workers = max(cpu_workers, min(profile.workers, max_processes), 1)
        # Past a few dozen threads a process gains little: add processes instead.
        workers = max(workers, math.ceil(in_flight / MAX_THREADS_PER_WORKER))
        threads = math.ceil(in_flight / workers)
    else:
        workers = min(max(in_flight, cpu_workers), max(max_processes, cpu_workers))
        threads = 1
    return LoadingAdvice(
        samples_per_s=rate,
        in_flight=in_flight,
        cores_needed=cores_needed,
        num_workers=workers,
        threads_per_worker=threads,
        speedup=speedup,
        new_step_s=new_step,
        latency_bound=latency_bound,
        limited_by=limited_by,
    )


def parallel_fix(advice: LoadingAdvice, has_loader: bool) -> str:
    """The fix that puts ``advice`` in place, in words a user can apply."""
    gain = f"predicted {advice.speedup:.1f}x faster (step {advice.new_step_s * 1000:.0f} ms)"
    if not has_loader and advice.latency_bound:
        return (
            f"Keep {advice.in_flight} samples in flight ({advice.samples_per_s:.0f} samples/s "
            "x the per-sample latency), in threads rather than processes: fetch each batch's "
            "samples with concurrent.futures.ThreadPoolExecutor("
            f"max_workers={advice.in_flight}) and submit the next batch's before training on "
            "this one, or fetch them asynchronously (asyncio/aiohttp); a request waiting on "
            f"I/O holds no CPU. {gain[0].upper()}{gain[1:]}."
        )
    if not has_loader:
        return (
            "Prepare batches while the step runs: move the batch building into a "
            "torch.utils.data.Dataset and iterate DataLoader(dataset, "
            f"num_workers={advice.num_workers}, persistent_workers=True, prefetch_factor=4) "
            f"({advice.in_flight} samples in flight); {gain}."
        )
    if advice.latency_bound:
        return (
            f"Keep {advice.in_flight} samples in flight ({advice.samples_per_s:.0f} samples/s "
            "x the per-sample latency), in threads rather than processes: "
            f"DataLoader(num_workers={advice.num_workers}, persistent_workers=True) and give "
            "the Dataset a __getitems__(self, indices) that fetches a batch's samples with "
            f"concurrent.futures.ThreadPoolExecutor(max_workers={advice.threads_per_worker}) "
            "(one pool per worker, made lazily), or fetch them asynchronously "
            f"(asyncio/aiohttp); {gain}."
        )
    return (
        f"Load in parallel: DataLoader(num_workers={advice.num_workers}, pin_memory=True, "
        f"persistent_workers=True, prefetch_factor=4) ({advice.in_flight} samples in flight); "
        f"{gain}."
    )
