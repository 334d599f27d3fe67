"""GradScaler skips: normal calibration is quiet, a scaling problem is named."""

from __future__ import annotations

import pytest

from support.builders import make_event, make_record, make_steps
from trainmedic.diagnose.amp import grad_scaler_skips
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Finding, Severity

TH = Thresholds()


def skips(*counts: tuple[int, int, int], pid: int = 4242) -> list[Finding]:
    """One ``grad_scaler`` event per (skipped, skipped after warm-up, scaler steps)."""
    events = [
        make_event(
            "grad_scaler",
            "GradScaler skipped ...",
            t=1000.0 + i,
            pid=pid,
            skipped=s,
            skipped_after_warmup=a,
            scaler_steps=n,
            warmup_steps=100,
            scale=2.0 ** (10 - s),
            final=i == len(counts) - 1,
        )
        for i, (s, a, n) in enumerate(counts)
    ]
    return grad_scaler_skips(RunView.of(make_record(make_steps(50), events=events)), TH)


def test_calibration_and_periodic_growth_skips_are_healthy() -> None:
    # 12 skips while the scale calibrates, then one per growth interval of 2000.
    assert skips((12, 0, 90), (17, 5, 10_100)) == []


def test_many_skips_after_warm_up_are_a_warning_with_their_share() -> None:
    (f,) = skips((10, 0, 100), (60, 50, 1100))
    assert f.id == "amp.skipped_steps" and f.category is Category.FRAMEWORK_CONFIG
    assert f.severity is Severity.WARNING
    assert f.evidence["skipped_after_warmup"] == 50 and f.evidence["scaler_steps"] == 1100
    assert f.impact == pytest.approx(50 / 1000)
    assert "bfloat16" in f.fix


def test_a_collapsing_scale_is_an_error() -> None:
    (f,) = skips((700, 690, 1100))
    assert f.severity is Severity.ERROR
    assert f.evidence["skipped_share_after_warmup"] == pytest.approx(0.69)


def test_a_few_skips_are_never_reported_even_in_a_short_run() -> None:
    assert skips((14, 4, 110)) == []
