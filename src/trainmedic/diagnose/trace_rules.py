"""Why the GPU idles inside each step, judged from a torch.profiler trace's real timings.

The input is a :class:`~trainmedic.traces.kineto.TraceSummary`: per
``ProfilerStep``, the main device's busy time (union over its streams), the
launches and host-device synchronisations started in the step with the host's
time in them, pageable copies and the NCCL time nothing else overlapped. Each
rule takes the median over the steps (a warm-up step or a checkpointing one does
not decide), and says its evidence in numbers and its impact as a share of the
step:

* ``gpu.host_sync`` - the host blocks on the GPU (``cudaStreamSynchronize``,
  ``cudaDeviceSynchronize``, a synchronous ``cudaMemcpy``: ``.item()``,
  ``.cpu()``, ``print(tensor)``, boolean masks) for at least
  :data:`SYNC_SHARE` of the step;
* ``gpu.launch_bound`` - the GPU idle at least :data:`IDLE_SHARE` of the step
  while the host launches many short kernels (mean kernel under
  :data:`SHORT_KERNEL_US`, at least :data:`MANY_LAUNCHES` a step);
* ``gpu.pageable_copies`` - copies from or to pageable host memory take at least
  :data:`COPY_SHARE` of the step (staged by the driver, synchronous for the host);
* ``gpu.exposed_communication`` - NCCL kernels run with nothing else on the GPU
  for at least :data:`EXPOSED_SHARE` of the step;
* ``gpu.idle_unexplained`` - the GPU idle at least :data:`IDLE_SHARE` of the step,
  :data:`UNEXPLAINED_SHARE` of it not accounted for by the above (information:
  what the trace lacks);
* ``gpu.bound`` - busy at least :data:`BUSY_SHARE` of each step and nothing
  above: the GPU is the limit (information; no host or input advice).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.traces.kineto import SyncSite, TraceStep, TraceSummary

SYNC_SHARE = 0.05
"""Host time blocked on the GPU, share of the step, from which it is a finding."""
SYNC_ERROR_SHARE = 0.25
IDLE_SHARE = 0.30
"""GPU idle share of the step from which idling needs an explanation."""
SHORT_KERNEL_US = 20.0
"""Mean kernel time under which launches (5-10 µs of host time each) can outrun them."""
MANY_LAUNCHES = 100
COPY_SHARE = 0.02
EXPOSED_SHARE = 0.10
EXPOSED_ERROR_SHARE = 0.30
UNEXPLAINED_SHARE = 0.20
"""Idle share left unexplained from which it is said (information)."""
BUSY_SHARE = 0.90
DATA_SHARE = 0.10
"""Time in ``next()`` on a DataLoader, share of the step, from which it is a finding."""
DATA_ERROR_SHARE = 0.40
ALLOC_SHARE = 0.02
"""Host time in the driver's memory calls, share of the step, from which it is a finding."""
ALLOC_ERROR_SHARE = 0.20
FRAGMENTED_RATIO = 1.5
"""Reserved over allocated at their peaks from which the cache holds memory it cannot use."""
FRAGMENTED_MIN_BYTES = 1 << 30
"""...and at least this much more reserved than allocated (small models' slack is no
finding)."""
MAX_SITES_SHOWN = 3


SYNC_FIXES: tuple[tuple[frozenset[str], str], ...] = (
    (frozenset({"Tensor.item", "aten::item", "aten::_local_scalar_dense"}),
     "Read scalars every N steps, not every step: accumulate the loss on the device "
     "(running += loss.detach()) and call .item() when you log."),
    (frozenset({"Tensor.cpu", "Tensor.tolist", "Tensor.numpy", "aten::to", "aten::_to_copy",
                "aten::copy_"}),
     "Copy results to the host every N steps, not every step (.cpu(), .tolist(), .numpy() "
     "each wait for the GPU); where a copy is needed, make it non_blocking=True into pinned "
     "memory and read it a step later."),
    (frozenset({"torch.cuda.synchronize", "torch.cuda.Event.synchronize",
                "torch.cuda.Stream.synchronize"}),
     "Take torch.cuda.synchronize() out of the loop: time steps with CUDA events read "
     "later, or not at all."),
    (frozenset({"Tensor.nonzero", "aten::nonzero", "aten::masked_select", "aten::index",
                "Tensor.__getitem__", "aten::unique", "aten::_unique2"}),
     "Avoid operations whose result size the host must learn (nonzero(), boolean-mask "
     "indexing, unique()): use fixed-shape forms such as torch.where(mask, x, 0) or a "
     "masked sum."),
    (frozenset({"Tensor.__bool__", "aten::is_nonzero", "Tensor.__float__", "Tensor.__int__"}),
     "Do not branch on a tensor's value in Python each step (if loss > x, float(t)): keep the "
     "decision on the device (torch.where) or check every N steps."),
)  # fmt: skip
"""What to do about a synchronisation, by what the user's code called."""
SYNC_FIX = (
    "Keep values on the device and read them every N steps: no loss.item(), .cpu(), "
    ".tolist() or print(tensor) each step (accumulate the loss in a tensor), no "
    "torch.cuda.synchronize() in the loop, no boolean-mask indexing or nonzero() whose size "
    "the host must learn; copy with non_blocking=True from pinned memory."
)


def _median(steps: tuple[TraceStep, ...], value: Callable[[TraceStep], float]) -> float:
    return statistics.median(value(s) for s in steps)


def _share(steps: tuple[TraceStep, ...], part: Callable[[TraceStep], float]) -> float:
    return _median(steps, lambda s: part(s) / s.dur_us if s.dur_us > 0 else 0.0)


def _subject(t: TraceSummary) -> str | None:
    if t.device is None:
        return None
    return f"gpu{t.device.index}" + (f" rank {t.rank}" if t.rank is not None else "")


def _base(t: TraceSummary) -> dict[str, object]:
    steps = t.steps
    ev: dict[str, object] = {
        "steps": len(steps),
        "step_time_median_ms": round(_median(steps, lambda s: s.dur_us) / 1000, 3),
        "gpu_busy_share": round(t.gpu_busy_share or 0.0, 4),
    }
    if t.device is not None and t.device.name:
        ev["gpu"] = t.device.name
    return ev


def _site_text(site: SyncSite) -> str:
    what = site.call or site.runtime
    return f"{what} in {site.where}" if site.where else what


def _host_sync(t: TraceSummary) -> Finding | None:
    """Synchronisations that leave the GPU idle: what counts is the GPU's idle time from
    each one's return to its next work (the drained queue refilling), not the host's time
    blocked, which a GPU-bound step spends while the GPU works."""
    steps = t.steps
    lost = _share(steps, lambda s: s.gpu_idle_after_sync_us)
    if lost < SYNC_SHARE or _median(steps, lambda s: s.syncs) < 1:
        return None
    ev: dict[str, object] = {
        **_base(t), "syncs_per_step": _median(steps, lambda s: s.syncs),
        "sync_ms_per_step": round(_median(steps, lambda s: s.sync_us) / 1000, 3),
        "gpu_idle_after_sync_ms_per_step": round(
            _median(steps, lambda s: s.gpu_idle_after_sync_us) / 1000, 3),
        "gpu_idle_after_sync_share": round(lost, 4),
    }  # fmt: skip
    sites = t.sync_sites[:MAX_SITES_SHOWN]
    if sites:
        ev["sync_sites"] = [
            {"where": x.where, "call": x.call, "runtime": x.runtime, "count": x.count,
             "host_ms": round(x.host_us / 1000, 3), "gpu_idle_ms": round(x.gpu_idle_us / 1000, 3)}
            for x in sites
        ]  # fmt: skip
    top = f", most from {_site_text(sites[0])}" if sites else ""
    fixes: list[str] = []
    for site in sites:
        fix = next((f for calls, f in SYNC_FIXES if site.call in calls), None)
        if fix is not None and fix not in fixes:
            fixes.append(fix)
    fix = " ".join(fixes) if fixes else SYNC_FIX
    if not t.with_stack:
        fix += " Record the trace with with_stack=True to see the call sites in your code."
    return Finding(
        id="gpu.host_sync", category=Category.FRAMEWORK_CONFIG,
        severity=Severity.ERROR if lost >= SYNC_ERROR_SHARE else Severity.WARNING,
        title=(f"Synchronisations leave the GPU idle {lost:.0%} of each step "
               f"({ev['syncs_per_step']:g} a step{top}): the GPU drains, then waits while the "
               "host catches up"),
        evidence=ev,
        fix=fix, impact=lost, subject=_subject(t),
    )  # fmt: skip


def _allocator_churn(t: TraceSummary) -> Finding | None:
    """The caching allocator going to the driver inside steps: each cudaMalloc is a miss
    of its cache, each cudaFree synchronises the whole device."""
    steps = t.steps
    calls = _median(steps, lambda s: s.allocs + s.frees)
    share = _share(steps, lambda s: s.alloc_us + s.free_us)
    if calls < 1 or share < ALLOC_SHARE:
        return None
    ev: dict[str, object] = {
        **_base(t), "driver_allocs_per_step": _median(steps, lambda s: s.allocs),
        "driver_frees_per_step": _median(steps, lambda s: s.frees),
        "driver_memory_ms_per_step": round(
            _median(steps, lambda s: s.alloc_us + s.free_us) / 1000, 3),
        "driver_memory_share": round(share, 4),
    }  # fmt: skip
    if t.peak_reserved_bytes is not None:
        ev["peak_reserved_bytes"] = t.peak_reserved_bytes
    if t.peak_allocated_bytes is not None:
        ev["peak_allocated_bytes"] = t.peak_allocated_bytes
    return Finding(
        id="gpu.allocator_churn", category=Category.GPU_MEMORY,
        severity=Severity.ERROR if share >= ALLOC_ERROR_SHARE else Severity.WARNING,
        title=(f"The caching allocator calls the driver {calls:g} times a step (cudaMalloc, "
               f"cudaFree), {share:.0%} of the step: its cache misses and every cudaFree "
               "synchronises the GPU"),
        evidence=ev,
        fix=("Let the cache serve every step: steady shapes (pad or bucket variable lengths, "
             "DataLoader(drop_last=True)), no torch.cuda.empty_cache() in the loop, and "
             "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True so segments grow instead of "
             "being freed and allocated again; near the memory limit, a smaller "
             "micro-batch."),
        impact=share, subject=_subject(t),
    )  # fmt: skip


def _fragmented(t: TraceSummary) -> Finding | None:
    """The cache holding far more than it hands out (``[memory]`` events' peaks)."""
    reserved, allocated = t.peak_reserved_bytes, t.peak_allocated_bytes
    if reserved is None or not allocated:
        return None
    ratio = reserved / allocated
    if ratio < FRAGMENTED_RATIO or reserved - allocated < FRAGMENTED_MIN_BYTES:
        return None
    total = t.device.total_memory_bytes if t.device is not None else None
    near_full = total is not None and reserved >= 0.9 * total
    ev: dict[str, object] = {**_base(t), "peak_reserved_bytes": reserved,
                             "peak_allocated_bytes": allocated,
                             "reserved_over_allocated": round(ratio, 2)}  # fmt: skip
    if total is not None:
        ev["gpu_memory_bytes"] = total
    gib = 1 << 30
    return Finding(
        id="gpu.memory_fragmented", category=Category.GPU_MEMORY,
        severity=Severity.WARNING if near_full else Severity.INFO,
        title=(f"The caching allocator holds {reserved / gib:.1f} GiB for "
               f"{allocated / gib:.1f} GiB in use at most ({ratio:.1f}x): memory split into "
               "blocks it cannot reuse" + (", near the GPU's total" if near_full else "")),
        evidence=ev,
        fix=("Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments that grow, not "
             "fixed blocks), keep tensor shapes steady from step to step, and free large "
             "temporaries before the next allocation of another size."),
        impact=None, subject=_subject(t),
    )  # fmt: skip


def diagnose_trace(t: TraceSummary) -> list[Finding]:
    """The findings of a trace with steps (a trace without is refused before this) and
    GPU activity (a trace of CPU activities alone has none to judge)."""
    if not t.steps or t.device is None:
        return []
    steps = t.steps
    busy = t.gpu_busy_share or 0.0
    idle = 1.0 - busy
    out: list[Finding] = []
    host_sync = _host_sync(t)
    if host_sync is not None:
        out.append(host_sync)
    data = _share(steps, lambda s: s.data_us)
    if data >= DATA_SHARE and idle >= DATA_SHARE:
        ev = {**_base(t), "data_wait_ms_per_step": round(_median(steps, lambda s: s.data_us)
                                                         / 1000, 3),
              "data_wait_share": round(data, 4), "gpu_idle_share": round(idle, 4)}  # fmt: skip
        out.append(Finding(
            id="gpu.waits_for_data", category=Category.FRAMEWORK_CONFIG,
            severity=Severity.ERROR if data >= DATA_ERROR_SHARE else Severity.WARNING,
            title=(f"The training loop waits {data:.0%} of each step for its next batch "
                   "(DataLoader spans) while the GPU idles"),
            evidence=ev,
            fix=("Load ahead of the step: DataLoader(num_workers=N, pin_memory=True, "
                 "persistent_workers=True, prefetch_factor=4). To learn which resource "
                 "the loading waits on (CPU, disk, network) and the worker count it needs, "
                 "run the job under 'trainmedic run'."),
            impact=data, subject=_subject(t),
        ))  # fmt: skip
    kernels = _median(steps, lambda s: s.kernels)
    mean_kernel = _median(steps, lambda s: s.kernel_us / s.kernels if s.kernels else 0.0)
    launches = _median(steps, lambda s: s.launches)
    if idle >= IDLE_SHARE and launches >= MANY_LAUNCHES and 0 < mean_kernel < SHORT_KERNEL_US:
        per_launch = _median(steps, lambda s: s.launch_us / s.launches if s.launches else 0.0)
        ev = {**_base(t), "launches_per_step": launches, "kernels_per_step": kernels,
              "mean_kernel_us": round(mean_kernel, 2),
              "host_us_per_launch": round(per_launch, 2),
              "gpu_idle_share": round(idle, 4)}  # fmt: skip
        out.append(Finding(
            id="gpu.launch_bound", category=Category.FRAMEWORK_CONFIG,
            severity=Severity.WARNING,
            title=(f"The GPU idles {idle:.0%} of each step between {launches:g} short kernels "
                   f"({mean_kernel:.1f} µs on average): the host cannot launch them as fast "
                   "as they run"),
            evidence=ev,
            fix=("Launch fewer, larger kernels: capture the step in CUDA graphs "
                 '(torch.compile(model, mode="reduce-overhead")), fuse the optimizer '
                 "(torch.optim.AdamW(..., fused=True) or foreach=True), and raise the batch "
                 "size so that each kernel does more."),
            impact=idle, subject=_subject(t),
        ))  # fmt: skip
    copies = _share(steps, lambda s: s.pageable_copy_us)
    if copies >= COPY_SHARE and _median(steps, lambda s: s.pageable_copies) >= 1:
        ev = {**_base(t), "pageable_copies_per_step": _median(steps, lambda s: s.pageable_copies),
              "pageable_copy_ms_per_step": round(
                  _median(steps, lambda s: s.pageable_copy_us) / 1000, 3),
              "pageable_copy_share": round(copies, 4)}  # fmt: skip
        out.append(Finding(
            id="gpu.pageable_copies", category=Category.FRAMEWORK_CONFIG,
            severity=Severity.WARNING,
            title=(f"Copies from pageable host memory take {copies:.0%} of each step: the "
                   "driver stages them and the host waits"),
            evidence=ev,
            fix=("Copy from pinned memory, asynchronously: DataLoader(..., pin_memory=True) "
                 "and batch.to(device, non_blocking=True); for tensors made in the loop, "
                 "tensor.pin_memory() once, or keep them on the GPU."),
            impact=copies, subject=_subject(t),
        ))  # fmt: skip
    churn = _allocator_churn(t)
    if churn is not None:
        out.append(churn)
    exposed = _share(steps, lambda s: s.exposed_nccl_us)
    if exposed >= EXPOSED_SHARE:
        ev = {**_base(t), "nccl_ms_per_step": round(_median(steps, lambda s: s.nccl_us) / 1000, 3),
              "exposed_nccl_ms_per_step": round(
                  _median(steps, lambda s: s.exposed_nccl_us) / 1000, 3),
              "exposed_nccl_share": round(exposed, 4)}  # fmt: skip
        if t.rank is not None:
            ev["rank"] = t.rank
        if t.world_size is not None:
            ev["world_size"] = t.world_size
        out.append(Finding(
            id="gpu.exposed_communication", category=Category.FRAMEWORK_CONFIG,
            severity=Severity.ERROR if exposed >= EXPOSED_ERROR_SHARE else Severity.WARNING,
            title=(f"Communication runs alone on the GPU {exposed:.0%} of each step: NCCL "
                   "kernels that no computation overlaps"),
            evidence=ev,
            fix=("Overlap the gradient all-reduce with the backward pass: DDP's "
                 "bucket_cap_mb (smaller buckets start sooner, e.g. 25 -> 10; larger ones "
                 "cost fewer launches), gradient_as_bucket_view=True, model.no_sync() on "
                 "all but the last micro-batch under gradient accumulation; for FSDP, "
                 "forward/backward prefetch."),
            impact=exposed, subject=_subject(t),
        ))  # fmt: skip
    explained = sum(f.impact or 0.0 for f in out if f.id != "gpu.allocator_churn")
    if idle >= IDLE_SHARE and idle - explained >= UNEXPLAINED_SHARE:
        ev = {**_base(t), "gpu_idle_share": round(idle, 4),
              "explained_share": round(explained, 4)}  # fmt: skip
        out.append(Finding(
            id="gpu.idle_unexplained", category=Category.FRAMEWORK_CONFIG,
            severity=Severity.INFO,
            title=(f"The GPU idles {idle:.0%} of each step, {idle - explained:.0%} of it not "
                   "in synchronisations, launches, pageable copies, data loading or exposed "
                   "communication"),
            evidence=ev,
            fix=("Not settled from the GPU side: the host does something else meanwhile. "
                 "Run the job under 'trainmedic run' (data wait, host time by stack "
                 "samples), or record the trace with with_stack=True to see the host's "
                 "frames in the gaps."),
            impact=None, subject=_subject(t),
        ))  # fmt: skip
    fragmented = _fragmented(t)
    if fragmented is not None:
        out.append(fragmented)
    if not out and busy >= BUSY_SHARE:
        out.append(Finding(
            id="gpu.bound", category=Category.MODEL, severity=Severity.INFO,
            title=(f"The GPU is busy {busy:.0%} of each step: the GPU is the limit, not the "
                   "host or the input"),
            evidence=_base(t),
            fix=("Faster steps come from the GPU's work itself: mixed precision (bf16 or "
                 "fp16 autocast) where it is not used, TF32 for fp32 matmuls, fused kernels "
                 "(torch.compile), or a larger GPU."),
            subject=_subject(t),
        ))  # fmt: skip
    return out
