"""GPU-bound training in full precision on a GPU with bf16 tensor cores (``model``)."""

from __future__ import annotations

from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.fixes import MIXED_PRECISION_CHECK_FIX
from trainmedic.findings.model import Category, Finding, Severity

#: bf16 tensor cores arrived with Ampere (compute capability 8.0).
BF16_MIN_CAPABILITY = (8, 0)


TF_FIX = (
    "Train in mixed precision: keras.mixed_precision.set_global_policy(\"mixed_bfloat16\") "
    "before the model is built (fit then keeps the weights in float32 and computes in "
    "bf16; a custom loop needs no loss scaling with bf16); and compile the step with XLA: "
    "model.compile(..., jit_compile=True), or @tf.function(jit_compile=True) on a custom "
    "loop's step. Measure it on your model: a few hundred steps with and without, "
    "compared with trainmedic compare RUN_A RUN_B."
)


def _tf_policies(view: RunView) -> list[str]:
    """The dtype policies TensorFlow processes of the job train with."""
    return [str(d["dtype_policy"]) for d in view.tf_gpu.values() if d.get("dtype_policy")]


def no_mixed_precision(view: RunView, th: Thresholds) -> list[Finding]:
    """GPU busy >= ``gpu_util_high_pct``, autocast off in >= ``autocast_off_share`` of the
    steps that report it (for TensorFlow: a ``float32`` dtype policy), compute
    capability >= 8.0."""
    if view.summary.steps_steady < th.min_steady_steps or view.uses_gpu is False:
        return []
    known = [s.autocast for s in view.steady_steps if s.autocast is not None]
    policies = _tf_policies(view)
    if len(known) >= th.min_steady_steps:
        off_share = sum(1 for a in known if not a) / len(known)
    elif policies:
        off_share = sum(1 for p in policies if not p.startswith("mixed")) / len(policies)
    else:
        return []
    busy = view.gpu_busy_share
    capability = view.compute_capability
    if (
        off_share < th.autocast_off_share
        or busy is None
        or busy * 100.0 < th.gpu_util_high_pct
        or capability is None
        or capability < BF16_MIN_CAPABILITY
    ):
        return []
    tf = len(known) < th.min_steady_steps
    return [
        Finding(
            id="model.no_mixed_precision",
            category=Category.MODEL,
            severity=Severity.WARNING,
            title=(
                f"GPU-bound ({busy:.0%} busy) in full precision on a GPU with bf16 tensor "
                f"cores (compute capability {capability[0]}.{capability[1]})"
            ),
            evidence={
                "gpu_busy_share": busy,
                "gpu_util_high_pct": th.gpu_util_high_pct,
                "autocast_off_share": off_share,
                "steps_with_autocast_known": len(known),
                **({"tf_dtype_policies": sorted(set(policies))} if policies else {}),
                "compute_capability": f"{capability[0]}.{capability[1]}",
                "mixed_precision_gain": th.mixed_precision_gain,
            },
            fix=(
                TF_FIX
                if tf
                else 'Run forward and loss under bf16 autocast: with torch.autocast("cuda", '
                "dtype=torch.bfloat16): loss = criterion(model(x), y) (no GradScaler needed "
                'with bf16); at least allow TF32: torch.set_float32_matmul_precision("high"). '
                + MIXED_PRECISION_CHECK_FIX
            ),
            impact=min(1.0, th.mixed_precision_gain * busy),
            subject=(f"gpu{view.job_gpu_indices[0]}" if len(view.job_gpu_indices) == 1 else None),
            apply=None if tf else {"torch": {"tf32_matmul": True}},
        )
    ]
