"""TensorFlow's hold on GPU memory (``gpu_memory``), from its own settings and pool.

By default TensorFlow takes nearly all of each visible GPU's memory at start
(:mod:`trainmedic.probe.tf_facts`). The GPU then reads full whatever the job needs;
a second process on it (another rank, a second job, an evaluation script) runs out
of memory, and nvidia-smi cannot tell why. The finding says how much the job really
uses (its pool's peak) against what it holds, and the setting that makes TensorFlow
take memory as it needs it: a warning when another process shares one of its GPUs,
information otherwise (the readings are explained; nothing is slowed).
"""

from __future__ import annotations

from typing import Any

from trainmedic.diagnose.thresholds import GIB, Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Finding, Severity

GROWTH_FIX = (
    "Let TensorFlow take GPU memory as it needs it: export TF_FORCE_GPU_ALLOW_GROWTH=true "
    "before starting the job (no code change), or call "
    "tf.config.experimental.set_memory_growth(gpu, True) for each GPU in "
    'tf.config.list_physical_devices("GPU") before the first TensorFlow op; to cap it '
    "instead, tf.config.set_logical_device_configuration(gpu, "
    "[tf.config.LogicalDeviceConfiguration(memory_limit=MIB)])."
)


def tf_memory_pool(view: RunView, th: Thresholds) -> list[Finding]:
    """TensorFlow holding its GPUs whole (:attr:`RunView.tf_preallocates`)."""
    if not view.tf_preallocates:
        return []
    held: list[float] = []
    total = view.job_gpu_memory_total_bytes
    totals = [total] if total else []
    sharing: set[int] = set()
    for i in view.job_gpu_indices:
        for g in view.gpu_series(i, steady_only=False):
            if g.memory_used_bytes is not None:
                held.append(g.memory_used_bytes)
            pids = {p.pid for p in g.processes}
            if len(pids) > 1:
                sharing |= pids
    peak = view.tf_pool_peak_bytes
    ev: dict[str, Any] = {
        "tf_memory_growth": [
            g.get("memory_growth") for d in view.tf_gpu.values() for g in d["gpus"]
        ],
        "tf_force_gpu_allow_growth": any(d.get("growth_env") for d in view.tf_gpu.values()),
    }
    if peak is not None:
        ev["tf_pool_peak_gib"] = peak / GIB
    if held:
        ev["gpu_memory_held_max_gib"] = max(held) / GIB
    if totals:
        ev["gpu_memory_total_gib"] = max(totals) / GIB
    if sharing:
        ev["processes_sharing_a_gpu"] = sorted(sharing)[:8]
    uses = f"; the job used {peak / GIB:.1f} GiB of it at peak" if peak is not None else ""
    holds = (
        f" ({max(held) / GIB:.1f} of {max(totals) / GIB:.1f} GiB)" if held and totals else ""
    )
    shared = bool(sharing)
    title = (
        f"TensorFlow holds the whole of its GPU's memory{holds}{uses}"
        + (
            f", and {len(sharing)} processes share that GPU: the others can run out of memory"
            if shared
            else ": nvidia-smi shows TensorFlow's pool, not what the job needs"
        )
    )
    return [
        Finding(
            id="memory.tf_whole_gpu",
            category=Category.GPU_MEMORY,
            severity=Severity.WARNING if shared else Severity.INFO,
            title=title,
            evidence=ev,
            fix=GROWTH_FIX,
            impact=None,
            subject=(f"gpu{view.job_gpu_indices[0]}" if len(view.job_gpu_indices) == 1 else None),
        )
    ]
