"""Safe, reversible torch switches that ``run --apply-from`` may turn on, and when.

Two switches, each on CUDA only, each decided twice: from the previous run's
evidence when the plan is made (:func:`plan_switches`, supervisor side) and
from what the new run's process sees when it applies them
(:func:`runtime_decision`, probe side):

- ``tf32_matmul``: ``torch.set_float32_matmul_precision("high")`` — float32
  matmuls on TF32 tensor cores (10-bit mantissa; cuDNN convolutions already use
  TF32 by default). Planned when a finding recommends it (GPU-bound float32
  training on compute capability 8.0 or newer); applied when the build has
  CUDA and the precision is still torch's default, ``"highest"``.
- ``cudnn_benchmark``: ``torch.backends.cudnn.benchmark = True`` — cuDNN times
  its algorithms once per input shape and keeps the fastest. Worth it for a
  GPU-bound job with fixed input shapes, harmful with shapes that keep
  changing (each new one is benchmarked). Planned when the previous run was
  GPU-bound on a GPU; applied only after the first
  :data:`SHAPE_CHECK_CALLS` calls of the model all had the same input shapes,
  and never when the script asked for deterministic algorithms.

Both are pure functions of small fact objects, so their logic is tested
without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

GPU_BOUND_SHARE = 0.5
"""GPU busy share of the previous run from which cuDNN autotuning is worth trying."""
TF32_MIN_CAPABILITY = (8, 0)
SHAPE_CHECK_CALLS = 20
"""Outermost model calls whose input shapes must all agree before cudnn.benchmark is set."""


@dataclass(frozen=True)
class RunEvidence:
    """What the previous run showed (from its record and findings).

    Attributes:
        uses_gpu: the job ran on a GPU (``None``: unknown).
        gpu_busy_share: share of the steady time the job's GPUs were busy.
        compute_capability: of the job's GPU.
        finding_ids: findings whose ``apply`` asks for ``tf32_matmul``.
    """

    uses_gpu: bool | None
    gpu_busy_share: float | None
    compute_capability: tuple[int, int] | None
    tf32_findings: tuple[str, ...] = ()


@dataclass(frozen=True)
class RuntimeFacts:
    """What the applying process sees.

    Attributes:
        cuda_build: torch was built with CUDA (``torch.version.cuda``).
        matmul_precision: ``torch.get_float32_matmul_precision()``.
        cudnn_benchmark: ``torch.backends.cudnn.benchmark``.
        deterministic: ``torch.backends.cudnn.deterministic`` or
            ``torch.are_deterministic_algorithms_enabled()``.
        shapes_fixed: the first calls of the model had equal input shapes
            (``None`` while still watching).
    """

    cuda_build: bool
    matmul_precision: str = "highest"
    cudnn_benchmark: bool = False
    deterministic: bool = False
    shapes_fixed: bool | None = None


def plan_switches(evidence: RunEvidence) -> tuple[dict[str, bool], dict[str, str]]:
    """(switches to plan, reason for each switch planned or not)."""
    planned: dict[str, bool] = {}
    reasons: dict[str, str] = {}
    if evidence.tf32_findings:
        planned["tf32_matmul"] = True
        reasons["tf32_matmul"] = f"recommended by {', '.join(evidence.tf32_findings)}"
    elif evidence.uses_gpu is not True:
        reasons["tf32_matmul"] = "not planned: the previous run did not use a GPU"
    else:
        reasons["tf32_matmul"] = "not planned: no finding recommends it"
    if evidence.uses_gpu is not True:
        reasons["cudnn_benchmark"] = "not planned: the previous run did not use a GPU"
    elif evidence.gpu_busy_share is None or evidence.gpu_busy_share < GPU_BOUND_SHARE:
        busy = "unknown" if evidence.gpu_busy_share is None else f"{evidence.gpu_busy_share:.0%}"
        reasons["cudnn_benchmark"] = (
            f"not planned: the GPU was busy {busy} of the time (autotuning pays when it is "
            f"the bottleneck, >= {GPU_BOUND_SHARE:.0%})"
        )
    else:
        planned["cudnn_benchmark"] = True
        reasons["cudnn_benchmark"] = (
            f"the GPU was busy {evidence.gpu_busy_share:.0%} of the time; applied once the "
            f"first {SHAPE_CHECK_CALLS} model calls show fixed input shapes"
        )
    if (
        planned.get("tf32_matmul")
        and evidence.compute_capability is not None
        and evidence.compute_capability < TF32_MIN_CAPABILITY
    ):
        del planned["tf32_matmul"]
        cc = evidence.compute_capability
        reasons["tf32_matmul"] = f"not planned: compute capability {cc[0]}.{cc[1]} has no TF32"
    return planned, reasons


def runtime_decision(switch: str, facts: RuntimeFacts) -> tuple[bool | None, str]:
    """Whether to turn ``switch`` on now: ``True``, ``False`` (never, with why) or
    ``None`` (not yet: still watching input shapes)."""
    if not facts.cuda_build:
        return False, "torch has no CUDA here (CPU build)"
    if switch == "tf32_matmul":
        if facts.matmul_precision != "highest":
            return False, f"the script chose float32 matmul precision {facts.matmul_precision!r}"
        return True, "float32 matmuls use TF32 tensor cores"
    if switch == "cudnn_benchmark":
        if facts.cudnn_benchmark:
            return False, "the script already sets cudnn.benchmark"
        if facts.deterministic:
            return False, "the script asks for deterministic algorithms"
        if facts.shapes_fixed is None:
            return None, "watching the model's input shapes"
        if not facts.shapes_fixed:
            return False, "the model's input shapes vary: autotuning would rerun for each"
        return True, f"the first {SHAPE_CHECK_CALLS} model calls had fixed input shapes"
    return False, f"unknown switch {switch!r}"
