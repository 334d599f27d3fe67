"""Why an input-bound loop waits: the catalogue of causes, one rule each.

The category names the resource the wait goes to; a setting that would hide
it (too few workers) belongs in the fix, sized from measurements
(:mod:`trainmedic.diagnose.loader_advice`). :func:`input_cause` takes the
first rule of :data:`INPUT_RULES` whose condition holds (docs/diagnosis.md,
"Input-bound training"):

1. loader stacks mostly reading files -> ``io``; on sockets -> ``network``;
2. loading threads starved of CPU by the job's own cgroup quota -> ``cpu``,
   or by other processes -> ``contention``;
3. no spare core left by the job's own loading -> ``cpu``;
4. a loop without a DataLoader that waits on other threads or processes: what
   they do (:mod:`trainmedic.diagnose.handoff_causes`);
5. batches built in series with the step (``num_workers=0``, or a loop with
   no DataLoader whose stacks show data code) while a core is spare and a
   worker process would gain (a batch cheaper to build than its hand-off from
   a worker would not) -> ``framework_config``;
6. without stack samples: host iowait -> ``io``; network receive -> ``network``;
7. too few workers while a core is spare -> ``framework_config``, else ``cpu``.

A stack state is "the" cause only when its share's interval is past the bar
with enough samples (:mod:`trainmedic.diagnose.sampled`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from trainmedic.diagnose.data_wait import data_wait, recommended_workers
from trainmedic.diagnose.loader_advice import (
    MIN_GAIN,
    LoadingAdvice,
    LoadingProfile,
    advise,
    fetch_time_s,
    latency_share,
    parallel_fix,
)
from trainmedic.diagnose.loading_cpu import LoadingCpu, cpu_evidence, loading_cpu, others_crowd
from trainmedic.diagnose.sampled import dominant_state, share_evidence
from trainmedic.diagnose.thresholds import MIB, Thresholds
from trainmedic.diagnose.view import BUSY_STATES, RunView
from trainmedic.findings.model import Category
from trainmedic.record.sample_states import DATA_STATES


@dataclass(frozen=True)
class InputCause:
    """Why the loop waits for data: the finding's id suffix, category, title and fix.

    Attributes:
        settled: the samples say what the wait is; ``False``: they are too few, and
            the finding is information saying what would settle it.
        remedies: the remedies appended to the fix; ``None``: the DataLoader's
            (:func:`trainmedic.findings.fixes.loader_remedies`).
    """

    key: str
    category: Category
    title: str
    fix: str
    evidence: Mapping[str, Any]
    settled: bool = True
    remedies: str | None = None


@dataclass(frozen=True)
class _Facts:
    """What the rules look at, measured once (cores as ``None``: not measured)."""

    view: RunView
    th: Thresholds
    has_loader: bool
    workers: int | None
    recommended: int
    busy_samples: int
    dominant: str | None
    cpu: LoadingCpu
    advice: LoadingAdvice | None

    @property
    def starved(self) -> bool:
        """The loading threads waited for a CPU a large share of the time."""
        wait = self.cpu.loading_wait
        return wait is not None and wait >= self.th.loader_starved_share

    @property
    def no_stacks(self) -> bool:
        """Too few stack samples of the loading to tell what it does."""
        return self.dominant is None and self.busy_samples < self.th.activity_min_samples

    @property
    def wanted_workers(self) -> int:
        return self.advice.num_workers if self.advice is not None else self.recommended

    @property
    def loading(self) -> str:
        """What loads: the DataLoader, or the loop itself."""
        return "loader" if self.has_loader else "loop"

    @property
    def worth_workers(self) -> bool:
        """More loader processes would gain: no measured advice says otherwise (a batch
        cheaper to build than a worker's hand-off of it gains nothing)."""
        return self.advice is None or self.advice.speedup >= MIN_GAIN

    @property
    def more(self) -> str:
        """The parallelism part of a fix for loading that waits on files or sockets."""
        return _more_parallel(self.advice, self.has_loader, self.workers, self.recommended)

    def parallel(self) -> str:
        """The fix that loads in parallel, sized from measurements when there are some."""
        if self.advice is not None:
            return parallel_fix(self.advice, self.has_loader)
        return _generic_parallel(self.recommended, self.cpu.usable, self.has_loader)


@dataclass(frozen=True)
class InputRule:
    """One cause: when it holds, and the finding's id suffix, category, title and fix."""

    key: str
    category: Category
    when: Callable[[_Facts], bool]
    title: str | Callable[[_Facts], str]
    fix: str | Callable[[_Facts], str]
    """Texts that depend on the measurements are functions of them."""

    def text(self, f: _Facts) -> tuple[str, str]:
        """The title and fix for these facts."""
        title = self.title if isinstance(self.title, str) else self.title(f)
        fix = self.fix if isinstance(self.fix, str) else self.fix(f)
        return title, fix


def _throttled(f: _Facts) -> bool:
    throttled = f.cpu.throttled
    return throttled is not None and throttled >= f.th.throttled_high_share and f.starved


def _crowded(f: _Facts) -> bool:
    competitors = (f.cpu.others or 0.0) >= f.th.others_min_cores
    return (f.starved and competitors) or (
        f.cpu.loading_wait is None and others_crowd(f.view, f.th)
    )


def _iowait(f: _Facts) -> bool:
    iowait = f.view.summary.iowait_mean_pct
    return f.no_stacks and iowait is not None and iowait >= f.th.iowait_high_pct


def _net_receive(f: _Facts) -> bool:
    s = f.view.summary
    net = s.net_recv_mean_bytes_per_s
    disk = s.disk_read_mean_bytes_per_s or 0.0
    return f.no_stacks and net is not None and net >= f.th.net_recv_high_bytes_per_s and net > disk


def _in_series_title(f: _Facts) -> str:
    if f.has_loader:
        return "the DataLoader has num_workers=0, so the training process loads every batch itself"
    return "the loop builds every batch itself, in series with the step"


def _always(f: _Facts) -> bool:
    return True


INPUT_RULES: tuple[InputRule, ...] = (
    InputRule(
        "io", Category.IO,
        when=lambda f: f.dominant == "file_read",
        title=lambda f: f"the {f.loading} spends its time reading files",
        fix=lambda f: (
            "Make reads cheaper: copy the data set to local NVMe/SSD (or /dev/shm), cache "
            "decoded samples, pack small files into sharded formats (WebDataset, "
            f"TFRecord, LMDB) and read them sequentially{f.more}"
        ),
    ),
    InputRule(
        "network", Category.NETWORK,
        when=lambda f: f.dominant == "socket_wait",
        title=lambda f: f"the {f.loading} spends its time waiting on network sockets",
        fix=lambda f: (
            "Hide or remove the network: copy or cache the data on local disk before "
            "training, or keep the data in the GPU's region; prefetch further ahead"
            f"{f.more}"
        ),
    ),
    InputRule(
        "cpu", Category.CPU,
        when=_throttled,
        title=lambda f: (
            f"the job's CPU quota stops it {f.cpu.throttled or 0.0:.0%} of the time "
            "(cgroup throttling)"
        ),
        fix=(
            "Raise the container's CPU limit (docker run --cpus, the pod's "
            "resources.limits.cpu) or use fewer threads and workers than the quota "
            "(torch.set_num_threads, num_workers) so the quota is not spent early in "
            "each period."
        ),
    ),
    InputRule(
        "contention", Category.CONTENTION,
        when=_crowded,
        title="other processes take the CPU the data loader needs",
        fix=(
            "Give the job dedicated cores: stop or move the other processes, or run them "
            "in a container/cgroup with a CPU limit (docker run --cpus, taskset)."
        ),
    ),
    InputRule(
        "cpu", Category.CPU,
        when=lambda f: not f.cpu.room(f.th),
        title="preparing batches uses every core the job has",
        fix=(
            "Make each sample cheaper or add cores: decode and augment on the GPU (NVIDIA "
            "DALI, torchvision.transforms.v2 on CUDA tensors), pre-process the data set "
            "once (resize, decode) and store the result, or run on a machine with more "
            "cores."
        ),
    ),
    InputRule(
        "workers", Category.FRAMEWORK_CONFIG,
        when=lambda f: f.workers == 0 and f.worth_workers,
        title=_in_series_title,
        fix=_Facts.parallel,
    ),
    InputRule(
        "io", Category.IO,
        when=_iowait,
        title=lambda f: (
            f"the host waits on storage ({f.view.summary.iowait_mean_pct or 0.0:.0f} % iowait)"
        ),
        fix=lambda f: (
            "Make reads cheaper: copy the data set to local NVMe/SSD, cache decoded "
            f"samples, pack small files into sharded formats{f.more}"
        ),
    ),
    InputRule(
        "network", Category.NETWORK,
        when=_net_receive,
        title=lambda f: (
            f"data arrives over the network "
            f"({(f.view.summary.net_recv_mean_bytes_per_s or 0.0) / MIB:.0f} MiB/s received)"
        ),
        fix=lambda f: (
            f"Copy or cache the data on local disk before training and prefetch more{f.more}"
        ),
    ),
    InputRule(
        "workers", Category.FRAMEWORK_CONFIG,
        when=lambda f: f.workers is not None and f.workers < f.wanted_workers and f.worth_workers,
        title="the loader has too few workers while a core is spare",
        fix=_Facts.parallel,
    ),
    InputRule(
        "cpu", Category.CPU,
        when=_always,
        title="preparing batches is slower than the training step",
        fix=(
            "Make each sample cheaper: decode and augment on the GPU (NVIDIA DALI, "
            "torchvision.transforms.v2 on CUDA tensors) or pre-process the data set once; "
            "profile the Dataset's __getitem__ to find the slow transform."
        ),
    ),
)  # fmt: skip
"""The causes in the order they are weighed; the last one always holds."""


def input_cause(view: RunView, th: Thresholds) -> InputCause:
    """The cause of the wait for data: a ``tf.data`` pipeline's
    (:mod:`~trainmedic.diagnose.tfdata_causes`), else the first rule of
    :data:`INPUT_RULES` that holds."""
    from trainmedic.diagnose.tfdata_causes import tfdata_cause

    tfdata = tfdata_cause(view, th)
    if tfdata is not None:
        return tfdata
    has_loader = bool(view.train_loaders)
    workers = view.num_workers if has_loader else 0
    n = recommended_workers(view, th)
    activity, worker_activity = _loading_activity(view)
    cpu = loading_cpu(view, th, workers)
    profile = _profile(view, th, workers or 0, activity, worker_activity)
    advice = advise(profile, n) if profile is not None else None
    facts = _Facts(
        view=view,
        th=th,
        has_loader=has_loader,
        workers=workers,
        recommended=n,
        busy_samples=sum(activity[k] for k in BUSY_STATES),
        dominant=_dominant(activity, th),
        cpu=cpu,
        advice=advice,
    )
    if not has_loader:
        # A loop waiting on other threads or processes: the cause is what they do. Their
        # CPU starved (by the quota, by others) is the rules' below when they compute.
        from trainmedic.diagnose.handoff_causes import handoff_cause

        starved = _throttled(facts) or _crowded(facts)
        handed = handoff_cause(view, th, starved=starved)
        if handed is not None:
            ev = {**cpu_evidence(cpu, view), **handed.evidence}
            return dataclasses.replace(handed, evidence=ev)
    evidence = _evidence(facts, activity, profile)
    rule = next(r for r in INPUT_RULES if r.when(facts))
    title, fix = rule.text(facts)
    # A wait on sockets to a server of this machine that computes is its CPU.
    from trainmedic.diagnose.server_causes import server_cause

    return server_cause(view, th, InputCause(rule.key, rule.category, title, fix, evidence))


def _evidence(f: _Facts, activity: Counter[str], profile: LoadingProfile | None) -> dict[str, Any]:
    """The measurements every cause shows: cores, loader stack shares, the advice's sizes."""
    s = f.view.summary
    ev: dict[str, Any] = {
        "num_workers": f.view.num_workers,
        "recommended_num_workers": f.wanted_workers,
        **cpu_evidence(f.cpu, f.view),
    }
    if f.busy_samples:
        ev.update(share_evidence("loader_", activity, BUSY_STATES, f.th, "loader_stack_samples"))
    if f.advice is not None and profile is not None:
        ev.update(f.advice.evidence(profile))
    for key, value in (
        ("iowait_pct", s.iowait_mean_pct),
        ("disk_read_mib_per_s", _mib(s.disk_read_mean_bytes_per_s)),
        ("net_recv_mib_per_s", _mib(s.net_recv_mean_bytes_per_s)),
    ):
        if value is not None:
            ev[key] = value
    storage = f.view.machine.storage if f.view.machine is not None else None
    if storage is not None:
        ev["data_dir_fs_type"] = storage.fs_type
        ev["data_dir_read_mib_per_s"] = storage.seq_read_mib_per_s
    return {k: v for k, v in ev.items() if v is not None}


# --- the facts the rules look at ------------------------------------------------------------


def _dominant(activity: Counter[str], th: Thresholds) -> str | None:
    return dominant_state(activity, BUSY_STATES, th)


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
    per_process = max(1.0, cores / view.concurrent_processes)
    useful = view.cpu.useful_cores(s.job_cpu_mean_cores, s.compute_share, view.usable_cores)
    return LoadingProfile(
        samples_per_step=samples,
        step_s=step,
        wait_s=min(wait_per_step, step),
        workers=workers,
        fetch_s=fetch,
        latency_share=latency_share(activity),
        cores=per_process,
        # Worker processes where there are none: each batch's hand-off costs the step.
        handoff_s=th.worker_handoff_s if workers == 0 else 0.0,
        useful_cores=None if useful is None else useful / view.concurrent_processes,
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
