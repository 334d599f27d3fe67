"""A GPU left idle although the loop does not wait for data.

Two causes, told apart by the batch: a small batch in a mostly empty GPU
(``gpu_capacity``: too little work per step) or, with a batch that is not
small, host-side overhead between kernels (``framework_config``: Python,
synchronisations, many tiny kernels). The rules never fire on an input-bound
run: there the idle GPU is the wait for data, reported by the input rule.
"""

from __future__ import annotations

import math
from typing import Any

from trainmedic.diagnose.data_wait import is_input_bound
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Finding, Severity

TORCH_HOST_FIX = (
    "Keep the GPU fed from the host: remove per-step synchronisations "
    "(loss.item(), .cpu(), .numpy(), printing tensors, torch.cuda.synchronize()) "
    "or do them every N steps; launch fewer, larger kernels with "
    'torch.compile(model, mode="reduce-overhead") (CUDA graphs) and fused '
    "optimizers (torch.optim.AdamW(..., fused=True)); raise the batch size."
)
TF_HOST_FIX = (
    "Keep the GPU fed from the host: run several steps per call with "
    "model.compile(..., steps_per_execution=32) and compile them with XLA "
    "(jit_compile=True); in a custom loop, put the step in @tf.function(jit_compile=True) "
    "and loop over several batches inside it; read losses and metrics (.numpy(), "
    "float(loss), printing tensors) every N steps, not every step; raise the batch size."
)


def _idle_gpu(view: RunView, th: Thresholds) -> tuple[float, float] | None:
    """(busy share, unexplained idle share) when the job's GPU is under-used and the
    loop does not wait for data; ``None`` otherwise."""
    if view.summary.steps_steady < th.min_steady_steps or view.uses_gpu is False:
        return None
    busy = view.gpu_busy_share
    if busy is None or busy * 100.0 >= th.gpu_util_low_pct:
        return None
    wait = view.summary.data_wait_share or 0.0
    if wait >= th.data_wait_warning_share or is_input_bound(view, th):
        return None
    return busy, max(0.0, 1.0 - busy - wait)


def batch_samples(view: RunView) -> float | None:
    """Samples per step and process: measured, else the training loader's batch size."""
    if view.summary.samples_per_step_mean is not None:
        return view.summary.samples_per_step_mean
    sizes = [lo.batch_size for lo in view.train_loaders if lo.batch_size]
    return float(min(sizes)) if sizes else None


def is_small_batch(view: RunView, th: Thresholds) -> bool:
    samples = batch_samples(view)
    memory = view.gpu_memory_used_share
    return (
        samples is not None
        and samples <= th.small_batch_samples
        and memory is not None
        and memory <= th.gpu_memory_low_share
    )


def _evidence(view: RunView, th: Thresholds, busy: float) -> dict[str, Any]:
    s = view.summary
    ev: dict[str, Any] = {
        "gpu_busy_share": busy,
        "gpu_utilization_pct": view.gpu_util_pct,
        "gpu_util_low_pct": th.gpu_util_low_pct,
        "gpu_time_share": s.gpu_time_share,
        "data_wait_share": s.data_wait_share,
        "host_compute_share": s.compute_share,
        "step_time_median_s": s.step_time_median_s,
        "samples_per_step": batch_samples(view),
        "gpu_memory_used_share": view.gpu_memory_used_share,
    }
    return {k: v for k, v in ev.items() if v is not None}


def small_batch(view: RunView, th: Thresholds) -> list[Finding]:
    """GPU under-used with at most ``small_batch_samples`` per step and little memory used."""
    idle = _idle_gpu(view, th)
    if idle is None or not is_small_batch(view, th):
        return []
    busy, lost = idle
    samples = batch_samples(view)
    memory = view.gpu_memory_used_share
    assert samples is not None and memory is not None
    # Grow the batch into the free memory, keeping a fifth of the GPU spare.
    factor = max(2, min(8, math.floor(0.8 / max(memory, 0.01))))
    target = int(samples * factor)
    ev = _evidence(view, th, busy)
    ev["small_batch_samples"] = th.small_batch_samples
    ev["gpu_memory_low_share"] = th.gpu_memory_low_share
    return [
        Finding(
            id="gpu.small_batch",
            category=Category.GPU_CAPACITY,
            severity=Severity.WARNING,
            title=(
                f"GPU busy only {busy:.0%} of the time with {samples:g} samples per step "
                f"and {memory:.0%} of its memory used"
            ),
            evidence=ev,
            fix=(
                "Give each step more work: "
                + (f"dataset.batch({target})" if view.framework == "tensorflow"
                   else f"DataLoader(batch_size={target})")
                + f" (x{factor}), scaling the learning rate with it (linear for SGD, about "
                "sqrt for Adam) with a short warm-up; or train several models/trials on "
                "this GPU at once."
            ),
            impact=lost,
            subject=_subject(view),
        )
    ]


def host_overhead(view: RunView, th: Thresholds) -> list[Finding]:
    """GPU under-used, little data wait, batch not small: host-side overhead."""
    idle = _idle_gpu(view, th)
    if idle is None or is_small_batch(view, th):
        return []
    busy, lost = idle
    wait = view.summary.data_wait_share or 0.0
    return [
        Finding(
            id="gpu.host_overhead",
            category=Category.FRAMEWORK_CONFIG,
            severity=Severity.WARNING,
            title=(
                f"GPU busy only {busy:.0%} of the time while the loop waits for data "
                f"{wait:.0%}: host-side overhead, synchronisations or tiny kernels"
            ),
            evidence=_evidence(view, th, busy),
            fix=TF_HOST_FIX if view.framework == "tensorflow" else TORCH_HOST_FIX,
            impact=lost,
            subject=_subject(view),
        )
    ]


def _subject(view: RunView) -> str | None:
    indices = view.job_gpu_indices
    if len(indices) == 1:
        return f"gpu{indices[0]}"
    return None
