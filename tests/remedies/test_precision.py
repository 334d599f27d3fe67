"""The mixed-precision check on CPU, where bf16 autocast exists."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainmedic.errors import UsageError
from trainmedic.remedies.precision import check_mixed_precision, supported_dtypes


def no_gc() -> None:
    """The full garbage collection costs 0.1-0.2 s and is not under test here."""


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g))] * 2


class CostClock:
    """A clock whose steps cost ``cost[autocast on?]`` seconds, advanced by the loss."""

    def __init__(self, fp32_s: float, bf16_s: float) -> None:
        self.now = 0.0
        self.cost = {False: fp32_s, True: bf16_s}

    def __call__(self) -> float:
        return self.now

    def loss(self, m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        self.now += self.cost[torch.is_autocast_enabled("cpu")]
        x, y = batch
        return nn.functional.cross_entropy(m(x), y)


def test_cpu_offers_bf16_autocast_and_not_fp16() -> None:
    assert supported_dtypes("cpu") == {"bfloat16": True, "float16": False}


def test_bf16_is_recommended_when_faster_with_the_loss_close() -> None:
    clock = CostClock(fp32_s=0.02, bf16_s=0.01)
    m = model()
    before = [p.clone() for p in m.parameters()]
    report = check_mixed_precision(m, batches(), clock.loss, clock=clock, free=no_gc)
    assert report.recommended == "bfloat16"
    assert report.speedup("bfloat16") == pytest.approx(2.0)
    diff = report.loss_rel_diff("bfloat16")
    assert diff is not None and 0 < diff < 0.05  # bf16 rounds, but stays close
    assert len(report.baseline.losses) == 6
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), before, strict=True))
    mp = report.apply()
    assert mp is not None and mp.scaler is None  # bf16 needs no loss scaling
    with mp.autocast():
        assert torch.is_autocast_enabled("cpu")
    assert "torch.bfloat16" in mp.code


def test_float32_stays_when_autocast_is_slower_here() -> None:
    clock = CostClock(fp32_s=0.01, bf16_s=0.03)
    report = check_mixed_precision(model(), batches(), clock.loss, clock=clock, free=no_gc)
    assert report.recommended is None and report.apply() is None
    assert "keep float32" in report.reason and "0.33x" in report.reason


def test_a_loss_that_drifts_too_far_is_not_recommended() -> None:
    clock = CostClock(fp32_s=0.02, bf16_s=0.01)

    def drifting(m: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        loss = clock.loss(m, batch)
        return loss * 2 if torch.is_autocast_enabled("cpu") else loss

    report = check_mixed_precision(model(), batches(), drifting, clock=clock, free=no_gc)
    assert report.recommended is None
    assert report.to_dict()["trials"][1]["loss_rel_diff"] > 0.5


def test_steps_must_exceed_the_warmup() -> None:
    with pytest.raises(UsageError):
        check_mixed_precision(
            model(), batches(), CostClock(1, 1).loss, steps=1, warmup=1, free=no_gc
        )
