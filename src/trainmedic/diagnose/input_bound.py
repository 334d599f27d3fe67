"""Input-bound training: the loop waits for batches. One finding, named by the resource.

The category names the resource the wait goes to; a setting that would hide
it (too few workers) belongs in the fix, sized from measurements
(:mod:`trainmedic.diagnose.loader_advice`). :func:`input_cause` walks the
evidence in a fixed order (docs/diagnosis.md, "Input-bound training"):

1. loader stacks mostly reading files -> ``io``; on sockets -> ``network``;
2. loading threads starved of CPU by other processes -> ``contention``, or by
   the job's own cgroup quota -> ``cpu``;
3. no spare core left by the job's own loading -> ``cpu``;
4. batches built in series with the step (``num_workers=0``, or a loop with
   no DataLoader whose stacks show data code) while a core is spare ->
   ``framework_config``;
5. without stack samples: host iowait -> ``io``; network receive -> ``network``;
6. too few workers while a core is spare -> ``framework_config``, else ``cpu``.

Only the ordinary wait counts: the wait inside stalls is the stall rule's
(:mod:`trainmedic.diagnose.stalls`), so no time is counted twice. In a loop
without a DataLoader, the time outside forward/backward/optimizer is data
preparation only in the share its stack samples show data code
(:mod:`trainmedic.diagnose.host_time` names the rest).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainmedic.diagnose.loader_advice import (
    LoadingAdvice,
    LoadingProfile,
    advise,
    fetch_time_s,
    latency_share,
    parallel_fix,
)
from trainmedic.diagnose.stalls import find_stalls
from trainmedic.diagnose.thresholds import MIB, Thresholds
from trainmedic.diagnose.view import BUSY_STATES, RunView, share_of
from trainmedic.findings.fixes import loader_remedies
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.probe.host_states import DATA_STATES


@dataclass(frozen=True)
class InputCause:
    """Why the loop waits for data: the finding's id suffix, category, title and fix."""

    key: str
    category: Category
    title: str
    fix: str
    evidence: Mapping[str, Any]


@dataclass(frozen=True)
class DataWait:
    """The wait for data over the steady part, seconds and shares of steady time.

    Attributes:
        recorded_s: the probe's data wait (DataLoader ``__next__``; without a
            DataLoader, host time outside forward/backward/optimizer).
        stall_s: of it, inside stalls (the stall rule counts that).
        data_share: share of the rest that is data preparation (1 with a
            DataLoader; the stack samples' data share without one; ``None``
            when they are too few to tell).
    """

    recorded_s: float
    stall_s: float
    data_share: float | None
    steady_s: float

    @property
    def ordinary_s(self) -> float:
        return max(0.0, self.recorded_s - self.stall_s)

    @property
    def share(self) -> float:
        """Ordinary data wait over steady time (the data part only)."""
        if self.steady_s <= 0:
            return 0.0
        return self.ordinary_s * (self.data_share or 0.0) / self.steady_s


def _measure_data_wait(view: RunView, th: Thresholds) -> DataWait:
    steady = view.steady_time_s
    recorded = sum(s.data_wait_s for s in view.steady)
    median = view.summary.step_time_median_s or 0.0
    stall_s = 0.0
    for st in find_stalls(view, th):
        span = st.span
        if span.step is not None:
            stall_s += span.data_wait_s
        else:  # a folded window: only the stall's excess can be told apart
            stall_s += min(span.data_wait_s, max(0.0, st.duration_s - median))
    return DataWait(recorded, min(stall_s, recorded), data_share(view, th), steady)


def data_wait(view: RunView, th: Thresholds) -> DataWait:
    """The run's :class:`DataWait` (computed once per view and thresholds)."""
    return view.memo(("data_wait", th), lambda: _measure_data_wait(view, th))


def data_share(view: RunView, th: Thresholds) -> float | None:
    """Share of the recorded wait that is data preparation (see :class:`DataWait`)."""
    if view.train_loaders:
        return 1.0
    outside = view.outside_activity()
    total = sum(outside.values())
    if total < th.outside_min_samples:
        return None
    return sum(outside.get(s, 0) for s in DATA_STATES) / total


def exposed_wait_share(view: RunView, th: Thresholds) -> float | None:
    """Share of steady step time the wait for data costs.

    The wait is all lost time unless the job's GPUs stay busy meanwhile (work
    queued before the wait): when they are busy at least ``gpu_util_high_pct``,
    only their idle share can be lost to waiting.
    """
    if view.summary.data_wait_share is None:
        return None
    wait = data_wait(view, th).share
    util = view.gpu_util_pct
    if util is not None and util >= th.gpu_util_high_pct:
        return min(wait, max(0.0, 1.0 - util / 100.0))
    return wait


def is_input_bound(view: RunView, th: Thresholds) -> bool:
    exposed = exposed_wait_share(view, th)
    return (
        view.summary.steps_steady >= th.min_steady_steps
        and exposed is not None
        and exposed >= th.data_wait_warning_share
    )


def recommended_workers(view: RunView, th: Thresholds) -> int:
    """Worker processes the cores justify per training process: the usable cores shared
    by the processes, one core kept for each main process, at least 2 and at most
    ``max_recommended_workers``."""
    cores = view.usable_cores or 4.0
    per_process = math.floor(cores / view.concurrent_processes) - 1
    return max(2, min(th.max_recommended_workers, per_process))


def input_bound(view: RunView, th: Thresholds) -> list[Finding]:
    """Data wait high: a warning from ``data_wait_warning_share``, an error from
    ``data_wait_error_share``."""
    if not is_input_bound(view, th):
        return []
    exposed = exposed_wait_share(view, th)
    assert exposed is not None
    s = view.summary
    wait = data_wait(view, th)
    cause = input_cause(view, th)
    severity = Severity.ERROR if exposed >= th.data_wait_error_share else Severity.WARNING
    evidence: dict[str, Any] = {
        "data_wait_share": s.data_wait_share,
        "data_wait_exposed_share": exposed,
        "data_wait_warning_share": th.data_wait_warning_share,
        "data_wait_error_share": th.data_wait_error_share,
        "step_time_median_s": s.step_time_median_s,
        "steady_steps": s.steps_steady,
    }
    if wait.stall_s > 0:
        evidence["stall_wait_excluded_s"] = wait.stall_s
    if not view.train_loaders and wait.data_share is not None:
        evidence["outside_step_data_share"] = wait.data_share
    if view.gpu_util_pct is not None:
        evidence["gpu_utilization_pct"] = view.gpu_util_pct
    evidence.update(cause.evidence)
    return [
        Finding(
            id=f"input.{cause.key}",
            category=cause.category,
            severity=severity,
            title=f"Training waits for data {exposed:.0%} of step time: {cause.title}",
            evidence=evidence,
            fix=f"{cause.fix} {loader_remedies(cause.category.value)}",
            impact=exposed,
            subject="dataloader",
            apply=loader_apply(view, th, cause),
        )
    ]


def loader_apply(view: RunView, th: Thresholds, cause: InputCause) -> dict[str, Any] | None:
    """The loader settings of the fix that ``run --apply-from`` may set: more worker
    processes where the cause is not a CPU already full (``cpu``, ``contention``),
    and fetch threads inside them where the loading waits on latency.

    The counts are the ones the fix recommends (sized from the measured fetch
    time when it could be). Threads are applied by wrapping the script's
    map-style dataset so that a batch's samples are fetched concurrently
    (:class:`~trainmedic.remedies.threaded.ThreadedFetch`)."""
    workers = view.num_workers
    wanted = cause.evidence.get("recommended_num_workers")
    n = int(wanted) if isinstance(wanted, (int, float)) else recommended_workers(view, th)
    if cause.category in (Category.CPU, Category.CONTENTION) or workers is None:
        return None
    threads = cause.evidence.get("recommended_threads_per_worker")
    threads = int(threads) if isinstance(threads, (int, float)) and threads > 1 else 1
    if workers >= n and threads == 1:
        return None
    settings: dict[str, Any] = {"num_workers": max(n, workers), "prefetch_factor": 4}
    if threads > 1:
        settings["threads"] = threads
    if view.uses_gpu:
        settings["pin_memory"] = True
    return {"dataloader": settings}


# --- the cause ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Cpu:
    """The CPU facts the cause depends on (cores; ``None``: not measured)."""

    usable: float | None
    job: float | None
    others: float | None
    useful: float | None
    spare: float | None
    loading_wait: float | None
    throttled: float | None

    def room(self, th: Thresholds) -> bool:
        """Whether another loader process has a core: spare cores at least
        ``spare_min_cores`` (and the share a saturated machine leaves)."""
        if self.spare is None or self.usable is None:
            return True  # nothing says the cores are full
        return self.spare >= _full_bar(self.usable, th)


def _full_bar(usable: float, th: Thresholds) -> float:
    # Job CPU is averaged over seconds and includes idle moments: on a big
    # machine, less than (1 - cpu_saturated_share) of it spare is full.
    return max(th.spare_min_cores, (1.0 - th.cpu_saturated_share) * usable)


def _cpu(view: RunView, th: Thresholds, workers: int | None) -> _Cpu:
    s = view.summary
    cpu = view.cpu
    usable = view.usable_cores
    useful = cpu.useful_cores(s.job_cpu_mean_cores, s.compute_share, usable)
    loading_wait = cpu.loader_wait_share if workers else cpu.train_wait_share
    others = s.others_cpu_mean_cores or 0.0
    waits = [w for w in (cpu.train_wait_share, cpu.loader_wait_share) if w is not None]
    if waits and max(waits) < th.cpu_wait_warning_share:
        # The job's threads got a CPU whenever they wanted one: others only used
        # what the job left (idle moments, lower priority), so they take no room.
        others = 0.0
    spare = None
    if usable is not None and useful is not None:
        spare = usable - useful - others
    return _Cpu(
        usable, s.job_cpu_mean_cores, s.others_cpu_mean_cores, useful, spare, loading_wait,
        cpu.throttled_share,
    )  # fmt: skip


def _dominant(activity: Counter[str], th: Thresholds) -> str | None:
    busy = sum(activity[k] for k in BUSY_STATES)
    if busy < th.activity_min_samples:
        return None
    top = max(BUSY_STATES, key=lambda k: activity[k])
    return top if share_of(activity, top, BUSY_STATES) >= th.activity_dominant_share else None


def _loading_activity(view: RunView) -> tuple[Counter[str], Counter[str]]:
    """(stack samples of everything that loads, of the worker processes alone)."""
    if view.train_loaders:
        everything = view.activity(pids=view.loader_pids | _activity_pids_without_steps(view))
        workers = view.activity(pids=view.worker_pids or _activity_pids_without_steps(view))
        return everything, workers
    outside = view.outside_activity()
    data = Counter({k: v for k, v in outside.items() if k in DATA_STATES})
    return data, Counter()


def _activity_pids_without_steps(view: RunView) -> frozenset[int]:
    """Processes that sent stack samples but no steps: workers whose role is unknown."""
    stepping = {s.pid for s in view.record.steps} | {w.pid for w in view.record.windows}
    return frozenset(a.pid for a in view.record.loader_activity if a.pid not in stepping)


def _profile(
    view: RunView,
    th: Thresholds,
    workers: int,
    activity: Counter[str],
    worker_activity: Counter[str],
) -> LoadingProfile | None:
    s = view.summary
    samples = s.samples_per_step_mean
    if samples is None:
        sizes = [lo.batch_size for lo in view.train_loaders if lo.batch_size]
        samples = float(min(sizes)) if sizes else None
    step = s.step_time_mean_s
    if samples is None or step is None or s.steps_steady <= 0:
        return None
    wait = data_wait(view, th)
    wait_per_step = wait.ordinary_s * (wait.data_share or 0.0) / s.steps_steady
    fetch = fetch_time_s(
        workers=workers,
        samples_per_step=samples,
        step_s=step,
        wait_s=wait_per_step,
        worker_activity=worker_activity,
    )
    if fetch is None:
        return None
    cores = view.usable_cores or 4.0
    per_process = max(1.0, cores / view.concurrent_processes - 1.0)
    return LoadingProfile(
        samples_per_step=samples,
        step_s=step,
        wait_s=min(wait_per_step, step),
        workers=workers,
        fetch_s=fetch,
        latency_share=latency_share(activity),
        cores=per_process,
    )


def input_cause(view: RunView, th: Thresholds) -> InputCause:
    """The cause of the wait for data, by the order in the module docstring."""
    s = view.summary
    has_loader = bool(view.train_loaders)
    workers = view.num_workers if has_loader else 0
    n = recommended_workers(view, th)
    activity, worker_activity = _loading_activity(view)
    busy = sum(activity[k] for k in BUSY_STATES)
    shares = {k: share_of(activity, k, BUSY_STATES) for k in BUSY_STATES}
    dominant = _dominant(activity, th)
    cpu = _cpu(view, th, workers)
    profile = _profile(view, th, workers or 0, activity, worker_activity)
    advice = advise(profile, n) if profile is not None else None

    ev: dict[str, Any] = {
        "num_workers": view.num_workers,
        "recommended_num_workers": advice.num_workers if advice is not None else n,
        "usable_cores": cpu.usable,
        "job_cpu_cores": cpu.job,
        "others_cpu_cores": cpu.others,
        "job_useful_cpu_cores": cpu.useful,
        "spare_cores": cpu.spare,
        "loading_cpu_wait_share": cpu.loading_wait,
        "cgroup_throttled_share": cpu.throttled or None,
    }
    if busy:
        ev.update({f"loader_{k}_share": round(v, 4) for k, v in shares.items()})
        ev["loader_stack_samples"] = busy
    if advice is not None and profile is not None:
        ev.update(advice.evidence(profile))
    for key, value in (
        ("iowait_pct", s.iowait_mean_pct),
        ("disk_read_mib_per_s", _mib(s.disk_read_mean_bytes_per_s)),
        ("net_recv_mib_per_s", _mib(s.net_recv_mean_bytes_per_s)),
    ):
        if value is not None:
            ev[key] = value
    storage = view.machine.storage if view.machine is not None else None
    if storage is not None:
        ev["data_dir_fs_type"] = storage.fs_type
        ev["data_dir_read_mib_per_s"] = storage.seq_read_mib_per_s
    ev = {k: v for k, v in ev.items() if v is not None}

    more = _more_parallel(advice, has_loader, workers, n)
    if dominant == "file_read":
        return InputCause(
            "io", Category.IO, "the loader spends its time reading files",
            "Make reads cheaper: copy the data set to local NVMe/SSD (or /dev/shm), cache "
            "decoded samples, pack small files into sharded formats (WebDataset, "
            f"TFRecord, LMDB) and read them sequentially{more}", ev,
        )  # fmt: skip
    if dominant == "socket_wait":
        return InputCause(
            "network", Category.NETWORK, "the loader spends its time waiting on network sockets",
            "Hide or remove the network: copy or cache the data on local disk before "
            "training, or keep the data in the GPU's region; prefetch further ahead"
            f"{more}", ev,
        )  # fmt: skip
    starved = cpu.loading_wait is not None and cpu.loading_wait >= th.loader_starved_share
    if cpu.throttled is not None and cpu.throttled >= th.throttled_high_share and starved:
        return InputCause(
            "cpu", Category.CPU,
            f"the job's CPU quota stops it {cpu.throttled:.0%} of the time (cgroup throttling)",
            "Raise the container's CPU limit (docker run --cpus, the pod's "
            "resources.limits.cpu) or use fewer threads and workers than the quota "
            "(torch.set_num_threads, num_workers) so the quota is not spent early in "
            "each period.", ev,
        )  # fmt: skip
    competitors = (cpu.others or 0.0) >= th.others_min_cores
    if (starved and competitors) or (cpu.loading_wait is None and others_crowd(view, th)):
        return InputCause(
            "contention", Category.CONTENTION,
            "other processes take the CPU the data loader needs",
            "Give the job dedicated cores: stop or move the other processes, or run them "
            "in a container/cgroup with a CPU limit (docker run --cpus, taskset).", ev,
        )  # fmt: skip
    if not cpu.room(th):
        return InputCause(
            "cpu", Category.CPU,
            "preparing batches uses every core the job has",
            "Make each sample cheaper or add cores: decode and augment on the GPU (NVIDIA "
            "DALI, torchvision.transforms.v2 on CUDA tensors), pre-process the data set "
            "once (resize, decode) and store the result, or run on a machine with more "
            "cores.", ev,
        )  # fmt: skip
    if workers == 0:
        title = (
            "the DataLoader has num_workers=0, so the training process loads every batch itself"
            if has_loader
            else "the loop builds every batch itself, in series with the step"
        )
        fix = (
            parallel_fix(advice, has_loader)
            if advice is not None
            else _generic_parallel(n, cpu.usable, has_loader)
        )
        return InputCause("workers", Category.FRAMEWORK_CONFIG, title, fix, ev)
    if dominant is None and busy < th.activity_min_samples:
        if s.iowait_mean_pct is not None and s.iowait_mean_pct >= th.iowait_high_pct:
            return InputCause(
                "io", Category.IO, f"the host waits on storage ({s.iowait_mean_pct:.0f} % iowait)",
                "Make reads cheaper: copy the data set to local NVMe/SSD, cache decoded "
                f"samples, pack small files into sharded formats{more}", ev,
            )  # fmt: skip
        net = s.net_recv_mean_bytes_per_s
        disk = s.disk_read_mean_bytes_per_s or 0.0
        if net is not None and net >= th.net_recv_high_bytes_per_s and net > disk:
            return InputCause(
                "network", Category.NETWORK,
                f"data arrives over the network ({net / MIB:.0f} MiB/s received)",
                f"Copy or cache the data on local disk before training and prefetch more{more}",
                ev,
            )  # fmt: skip
    wanted = advice.num_workers if advice is not None else n
    if workers is not None and workers < wanted:
        return InputCause(
            "workers", Category.FRAMEWORK_CONFIG,
            "the loader has too few workers while a core is spare",
            parallel_fix(advice, has_loader)
            if advice is not None
            else _generic_parallel(n, cpu.usable, has_loader),
            ev,
        )  # fmt: skip
    return InputCause(
        "cpu", Category.CPU, "preparing batches is slower than the training step",
        "Make each sample cheaper: decode and augment on the GPU (NVIDIA DALI, "
        "torchvision.transforms.v2 on CUDA tensors) or pre-process the data set once; "
        "profile the Dataset's __getitem__ to find the slow transform.", ev,
    )  # fmt: skip


def others_crowd(view: RunView, th: Thresholds) -> bool:
    """Without thread measurements: others take a large share of the cores and the
    machine is full."""
    s = view.summary
    cores = view.usable_cores
    others = s.others_cpu_mean_cores
    if cores is None or others is None or s.system_cpu_mean_pct is None:
        return False
    return (
        others >= max(1.0, th.others_cpu_share * cores)
        and s.system_cpu_mean_pct >= th.system_cpu_busy_pct
    )


def _more_parallel(
    advice: LoadingAdvice | None, has_loader: bool, workers: int | None, n: int
) -> str:
    """The parallelism part of a fix for loading that waits on files or sockets."""
    if advice is not None:
        enough = (
            workers is not None and workers >= advice.num_workers and advice.threads_per_worker <= 1
        )
        if enough or advice.speedup < 1.05:
            return "."  # as many loaders as the measured latency needs are there
        fix = parallel_fix(advice, has_loader)
        return "; meanwhile hide the wait. " + fix
    if has_loader and workers is not None and workers < n:
        return (
            f"; meanwhile overlap the waits: DataLoader(num_workers={n}, "
            "persistent_workers=True, prefetch_factor=4)."
        )
    return "."


def _generic_parallel(n: int, cores: float | None, has_loader: bool) -> str:
    where = "" if has_loader else "move the batch building into a Dataset and "
    count = "?" if cores is None else f"{cores:g}"
    return (
        f"Load in parallel: {where}DataLoader(..., num_workers={n}, pin_memory=True, "
        f"persistent_workers=True, prefetch_factor=4); {n} workers fit the {count} usable cores."
    )


def _mib(value: float | None) -> float | None:
    return None if value is None else value / MIB
