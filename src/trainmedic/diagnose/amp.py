"""Optimizer steps GradScaler skipped (``framework_config``): fp16 loss scaling gone wrong.

The probe counts ``scaler.step()`` calls that did not step the optimizer
(``grad_scaler`` events, :mod:`trainmedic.probe.amp`). GradScaler skips a
few steps while its scale calibrates (the first ``warmup_steps``) and one
per ``growth_interval`` (2000 by default) when it probes a larger scale:
about 0.05 %. Skipping ``amp_skip_warning_share`` of the steps after the
warm-up (at least ``amp_skip_min`` of them) is a warning;
``amp_skip_error_share`` an error - the model barely trains, usually because
the loss or the gradients are inf/NaN whatever the scale (the scale then
collapses toward 0).
"""

from __future__ import annotations

from typing import Any

from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.record.events import EventKind

FIX = (
    "fp16 gradients overflow: train with bf16 autocast instead "
    '(torch.autocast("cuda", dtype=torch.bfloat16); no GradScaler needed on Ampere and '
    "newer). If the scale keeps falling, the loss or gradients are inf/NaN at any scale: check "
    "the data for NaN/inf, lower the learning rate, and clip gradients after "
    "scaler.unscale_(optimizer); torch.autograd.set_detect_anomaly(True) for one step "
    "names the operation."
)


def grad_scaler_skips(view: RunView, th: Thresholds) -> list[Finding]:
    latest: dict[int | None, dict[str, Any]] = {}
    for e in view.record.events:
        if e.kind != EventKind.GRAD_SCALER:
            continue
        data = dict(e.data)
        prev = latest.get(e.pid)
        if prev is None or int(data.get("scaler_steps", 0)) >= int(prev.get("scaler_steps", 0)):
            latest[e.pid] = data
    if not latest:
        return []
    skipped = sum(int(d.get("skipped", 0)) for d in latest.values())
    after = sum(int(d.get("skipped_after_warmup", 0)) for d in latest.values())
    steps = sum(int(d.get("scaler_steps", 0)) for d in latest.values())
    warmup = max((int(d.get("warmup_steps", 0)) for d in latest.values()), default=0)
    counted = sum(max(0, int(d.get("scaler_steps", 0)) - warmup) for d in latest.values())
    if counted <= 0 or after < th.amp_skip_min:
        return []
    share = after / counted
    if share < th.amp_skip_warning_share:
        return []
    severity = Severity.ERROR if share >= th.amp_skip_error_share else Severity.WARNING
    scales = [d["scale"] for d in latest.values() if isinstance(d.get("scale"), (int, float))]
    evidence: dict[str, Any] = {
        "skipped_steps": skipped,
        "skipped_after_warmup": after,
        "scaler_steps": steps,
        "warmup_steps": warmup,
        "skipped_share_after_warmup": share,
        "skip_warning_share": th.amp_skip_warning_share,
    }
    if scales:
        evidence["loss_scale_at_last_skip"] = float(min(scales))
    return [
        Finding(
            id="amp.skipped_steps",
            category=Category.FRAMEWORK_CONFIG,
            severity=severity,
            title=(
                f"GradScaler skipped {after} of {counted} optimizer steps after its warm-up "
                f"({share:.0%}): inf/NaN gradients under fp16 loss scaling"
            ),
            evidence=evidence,
            detail=(
                "A skipped step computes forward and backward and throws the result away; "
                "GradScaler skips about one step in 2000 when healthy."
            ),
            fix=FIX,
            impact=min(1.0, share),
        )
    ]
