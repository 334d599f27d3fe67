"""Stalls: steady training steps far slower than the median, grouped by where the time went.

A stall is a steady ``train`` step longer than both ``stall_factor`` x the
median step and ``stall_floor_s``: warm-up steps and ``eval``/``checkpoint``
phases never count. Each stall gets a cause from what coincided with it:

* data wait >= ``stall_data_share`` of the step: the loader's stack samples
  during the stall (file reads -> ``io``, sockets -> ``network``, transforms
  -> ``cpu``), else host readings (iowait, network receive, CPU), else the
  run's overall loader activity, else ``io``;
* otherwise GPU-side or unknown: GPU throttled meanwhile -> ``thermal``; GPU
  time >= half the step -> ``gpu_capacity``;
* otherwise host-side: the training thread spent at least half the stall's
  extra time waiting for a CPU (measured run-queue delay) -> ``contention``,
  else ``framework_config`` (garbage collection, synchronisations, logging, a
  synchronous save in the training loop); without thread readings, others'
  CPU high meanwhile -> ``contention``.

A data stall on the first step of an epoch, with a loader whose workers do
not persist, is the workers' restart (``stall.epoch_start``). Stalls costing
``stall_warning_share`` of steady time are a warning when there are several
or one lasted ``stall_single_warning_s``; otherwise information.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

from trainmedic.diagnose.sampled import dominant_state
from trainmedic.diagnose.thermal import throttled_intervals
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import (
    BUSY_STATES,
    Interval,
    RunView,
    merge_intervals,
    overlaps,
    sample_intervals,
)
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.record.stats import StepSpan

MAX_LISTED = 10
#: shorter "epochs" are too short to tell from any other periodic pause.
MIN_EPOCH_STEPS = 5
_STATE_CATEGORY = {
    "file_read": Category.IO,
    "socket_wait": Category.NETWORK,
    "transform": Category.CPU,
}

_TEXT: dict[str, tuple[str, str]] = {
    "io": (
        "waiting on file reads",
        "Make reads steady: copy the data to local NVMe/SSD or cache it, pack small files "
        "into sharded formats, and raise prefetch_factor so workers read ahead of slow reads.",
    ),
    "network": (
        "waiting on the network",
        "Copy or cache the data locally before training, or prefetch far enough ahead "
        "(prefetch_factor, more workers) to ride out network hiccups.",
    ),
    "cpu": (
        "waiting for batches while the loader was busy computing",
        "Smooth out expensive samples: cheaper or GPU-side transforms (DALI, "
        "torchvision.transforms.v2 on CUDA), pre-processed data, more workers.",
    ),
    "thermal": (
        "while the GPU was throttled",
        "See the thermal finding for this GPU: cooling, power limit or power delivery.",
    ),
    "gpu_capacity": (
        "in GPU work",
        "Find the slow kernels of these steps (torch.profiler around them); uneven input "
        "sizes (long sequences) cost GPU time: bucket or cap them.",
    ),
    "contention": (
        "while other processes loaded the CPU",
        "Reserve the cores: stop or move the other processes, or limit them with a "
        "container/cgroup (docker run --cpus, taskset).",
    ),
    "epoch_start": (
        "at the start of an epoch, while the DataLoader started new workers",
        "Keep the workers between epochs: DataLoader(..., persistent_workers=True); the "
        "first batches of an epoch then come from workers that are already running.",
    ),
    "framework_config": (
        "on the host side (no data wait, GPU idle)",
        "Look for work done every N steps in the loop: gc.collect() or Python garbage "
        "collection (gc.freeze() after setup), torch.cuda.synchronize()/.item() in logging, "
        "synchronous torch.save in the training loop (save asynchronously or mark it with "
        "a checkpoint phase).",
    ),
}


_HOST_SIDE_CPU_ONLY = "on the host side (no data wait)"
_TF_HOST_SIDE_FIX = (
    "Look for work done every N steps in the loop: Python garbage collection "
    "(gc.freeze() after setup), a callback that logs or reads tensors (.numpy(), "
    "float(loss)) every N steps, a tf.function traced again (a new input shape or a "
    "Python value as an argument: give it an input_signature), synchronous "
    "model.save or checkpoint writes (tf.train.CheckpointManager in a callback: mark "
    "it with a checkpoint phase, or save less often)."
)


@dataclass(frozen=True)
class Stall:
    """One stall: an exact step, or the longest step of a folded window."""

    span: StepSpan
    duration_s: float
    category: Category
    key: str

    @property
    def step(self) -> int:
        return self.span.step.step if self.span.step is not None else self.span.first_step


def stall_limit_s(view: RunView, th: Thresholds) -> float | None:
    median = view.summary.step_time_median_s
    if median is None:
        return None
    return max(th.stall_factor * median, th.stall_floor_s)


def find_stalls(view: RunView, th: Thresholds) -> list[Stall]:
    """Every stall of the steady part, each with its cause."""
    limit = stall_limit_s(view, th)
    if limit is None or view.summary.steps_steady < th.min_steady_steps:
        return []
    throttled = merge_intervals(throttled_intervals(view, th))
    epochs = epoch_lengths(view)
    out = []
    for span in view.steady:
        if span.duration_max_s <= limit:
            continue
        category = _cause(span, view, th, throttled)
        key = category.value
        step = span.step.step if span.step is not None else span.first_step
        if _is_data_stall(span, th) and any((step - 1) % n == 0 for n in epochs):
            category, key = Category.FRAMEWORK_CONFIG, "epoch_start"
        out.append(Stall(span, span.duration_max_s, category, key))
    return out


def epoch_lengths(view: RunView) -> set[int]:
    """Steps per epoch of a training loader whose workers restart every epoch.

    From the data set's length, the batch size and the processes sharing the
    data set (a DistributedSampler splits it); rounded both ways, since
    ``drop_last`` is not recorded. Empty when workers persist or it is unknown.
    """
    loaders = view.train_loaders
    if not loaders:
        return set()
    lo = loaders[0]
    if lo.num_workers == 0 or lo.persistent_workers or not lo.dataset_len or not lo.batch_size:
        return set()
    world = view.concurrent_processes
    out = set()
    for per_rank in (math.ceil(lo.dataset_len / world), lo.dataset_len // world):
        for steps in (math.ceil(per_rank / lo.batch_size), per_rank // lo.batch_size):
            if steps >= MIN_EPOCH_STEPS:
                out.add(steps)
    return out


def _is_data_stall(span: StepSpan, th: Thresholds) -> bool:
    return span.duration_s > 0 and span.data_wait_s >= th.stall_data_share * span.duration_s


def stalls(view: RunView, th: Thresholds) -> list[Finding]:
    found = find_stalls(view, th)
    if not found or view.steady_time_s <= 0:
        return []
    median = view.summary.step_time_median_s
    limit = stall_limit_s(view, th)
    assert median is not None and limit is not None
    start = view.record.meta.started_at
    by_cause: dict[str, list[Stall]] = {}
    for st in found:
        by_cause.setdefault(st.key, []).append(st)
    findings = []
    for key, group in by_cause.items():
        lost = sum(st.duration_s - median for st in group)
        impact = min(1.0, lost / view.steady_time_s)
        longest = max(st.duration_s for st in group)
        # One short hiccup cannot be told from a one-off event on the machine.
        repeated_or_long = len(group) > 1 or longest >= th.stall_single_warning_s
        what, fix = _TEXT[key]
        if key == "framework_config" and view.uses_gpu is False:
            what = _HOST_SIDE_CPU_ONLY  # no GPU to sit idle
        if key == "framework_config" and view.framework == "tensorflow":
            fix = _TF_HOST_SIDE_FIX
        ev: dict[str, Any] = {
            "stalls": len(group),
            "stall_steps": [st.step for st in group[:MAX_LISTED]],
            "stall_at_s": [round(st.span.t_end - start, 3) for st in group[:MAX_LISTED]],
            "stall_longest_s": longest,
            "time_lost_s": lost,
            "step_time_median_s": median,
            "stall_threshold_s": limit,
            "stall_factor": th.stall_factor,
            "stall_floor_s": th.stall_floor_s,
        }
        waits = [st.span.data_wait_s / st.span.duration_s for st in group if st.span.duration_s]
        if waits:
            ev["stall_data_wait_share_mean"] = sum(waits) / len(waits)
        pids = sorted({st.span.pid for st in group})
        if len(pids) > 1:
            ev["pids"] = pids
        n = len(group)
        findings.append(
            Finding(
                id=f"stall.{key}",
                category=group[0].category,
                severity=(
                    Severity.WARNING
                    if impact >= th.stall_warning_share and repeated_or_long
                    else Severity.INFO
                ),
                title=(
                    f"{n} stall{'s' if n > 1 else ''} {what}: {lost:.1f} s lost "
                    f"(steps over {limit:.2f} s, median {median:.3f} s)"
                ),
                evidence=ev,
                fix=fix,
                impact=impact,
            )
        )
    return findings


def _cause(span: StepSpan, view: RunView, th: Thresholds, throttled: list[Interval]) -> Category:
    window = (span.t_start, span.t_end)
    host = _host_during(view, window)
    cores = view.usable_cores
    if _is_data_stall(span, th):
        return _data_cause(view, th, window, host, cores)
    gpu_share = span.gpu_share if span.gpu_time_s else None
    host_side = span.gpu_time_s is not None and (gpu_share or 0.0) < 0.5
    if not host_side:
        if throttled and overlaps(throttled, [a for a, _ in throttled], *window):
            return Category.THERMAL
        if gpu_share is not None:
            return Category.GPU_CAPACITY
    waited = _waited_s(view, window)
    if waited is not None:
        # Measured: contention made the stall only if the training thread spent most
        # of the stall's extra time waiting for a CPU (others merely busy meanwhile
        # do not make a synchronous save theirs).
        excess = span.duration_max_s - (view.summary.step_time_median_s or 0.0)
        return Category.CONTENTION if waited >= 0.5 * excess else Category.FRAMEWORK_CONFIG
    if cores is not None and any(
        h.others_cpu_pct is not None
        and h.others_cpu_pct / 100.0 >= max(1.0, th.others_cpu_share * cores)
        for h in host
    ):
        return Category.CONTENTION
    return Category.FRAMEWORK_CONFIG


def _data_cause(
    view: RunView,
    th: Thresholds,
    window: Interval,
    host: list[Any],
    cores: float | None,
) -> Category:
    """Cause of a data stall: stacks during it, host readings during it, the whole run."""
    local = _dominant(view.activity(window), th)
    if local is not None:
        return local
    if any(h.iowait_pct is not None and h.iowait_pct >= th.iowait_high_pct for h in host):
        return Category.IO
    if any(
        h.net_recv_bytes_per_s is not None
        and h.net_recv_bytes_per_s >= th.net_recv_high_bytes_per_s
        for h in host
    ):
        return Category.NETWORK
    if cores is not None and any(
        h.job_cpu_pct / 100.0 >= th.cpu_saturated_share * cores for h in host
    ):
        return Category.CPU
    return _dominant(view.activity(), th) or Category.IO


def _dominant(activity: Counter[str], th: Thresholds) -> Category | None:
    """The category the loader stacks name, when their samples settle it
    (:func:`trainmedic.diagnose.sampled.dominant_state`)."""
    top = dominant_state(activity, BUSY_STATES, th)
    return None if top is None else _STATE_CATEGORY.get(top)


def _waited_s(view: RunView, window: Interval) -> float | None:
    """Seconds the most-waiting training thread waited for a CPU within ``window``, from
    the host readings covering it; ``None`` without thread readings there."""
    host = sorted(view.record.host, key=lambda h: h.t)
    waited = None
    for h, (a, b) in zip(host, sample_intervals([h.t for h in host]), strict=True):
        overlap = min(b, window[1]) - max(a, window[0])
        if overlap > 0 and h.train_wait_max_share is not None:
            waited = (waited or 0.0) + h.train_wait_max_share * overlap
    return waited


def _host_during(view: RunView, window: Interval) -> list[Any]:
    host = sorted(view.record.host, key=lambda h: h.t)
    ivs = sample_intervals([h.t for h in host])
    return [h for h, (a, b) in zip(host, ivs, strict=True) if a <= window[1] and b >= window[0]]
