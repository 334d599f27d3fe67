"""The batch-size finder: grow, bisect, keep a margin, keep the effective batch."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainmedic.errors import UsageError
from trainmedic.remedies.batch_size import find_batch_size, plan_accumulation

OOM = "CUDA out of memory. Tried to allocate 2.00 GiB"


class Capped(nn.Module):
    """A model whose step runs out of memory above ``limit`` samples."""

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit
        self.lin = nn.Linear(4, 2)
        self.sizes: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.sizes.append(len(x))
        if len(x) > self.limit:
            raise torch.cuda.OutOfMemoryError(OOM)
        return self.lin(x)


def no_gc() -> None:
    """The full garbage collection costs 0.1-0.2 s and is not under test here."""


def ticks() -> object:
    t = [0.0]

    def clock() -> float:
        t[0] += 0.5
        return t[0]

    return clock


def test_grows_by_doubling_then_bisects_to_the_largest_size_that_fits() -> None:
    model = Capped(limit=100)
    result = find_batch_size(
        model, lambda n: torch.zeros(n, 4), repeats=1, clock=ticks(), free=no_gc
    )
    tried = [(t.size, t.fits) for t in result.trials]
    assert tried[:8] == [(1, True), (2, True), (4, True), (8, True), (16, True), (32, True),
                         (64, True), (128, False)]  # fmt: skip
    assert result.largest_fit == 100 and result.first_failure == 101
    assert result.micro_batch_size == 90  # 10 % margin
    assert all(t.samples_per_s == t.size / 0.5 for t in result.trials if t.fits)


def test_the_accumulation_steps_keep_the_effective_batch_exact() -> None:
    result = find_batch_size(
        Capped(limit=40),
        lambda n: torch.zeros(n, 4),
        effective_batch_size=256,
        repeats=1,
        free=no_gc,
    )
    assert result.largest_fit == 40
    assert (result.micro_batch_size, result.accumulation_steps) == (32, 8)


@pytest.mark.parametrize(
    ("fit", "effective", "plan"),
    [
        (36, 256, (32, 8)),  # the largest divisor that fits
        (50, 49, (49, 1)),  # everything fits
        (36, 257, (36, 8)),  # a prime: no good divisor, 8 x 36 = 288 >= 257
        (36, None, (36, 1)),
    ],
)
def test_plan_accumulation(fit: int, effective: int | None, plan: tuple[int, int]) -> None:
    assert plan_accumulation(fit, effective) == plan


def test_no_failure_up_to_the_maximum_keeps_no_margin_and_says_so() -> None:
    result = find_batch_size(
        Capped(limit=10**6), lambda n: torch.zeros(n, 4), max_size=48, free=no_gc
    )
    assert result.first_failure is None
    assert result.largest_fit == result.micro_batch_size == 48


def test_trying_sizes_does_not_train_the_model() -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    find_batch_size(
        model, lambda n: torch.randn(n, 4), optimizer=opt, max_size=64, repeats=1, free=no_gc
    )
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])
    assert opt.state_dict()["state"] == {}
    assert all(p.grad is None for p in model.parameters())


def test_a_single_sample_that_does_not_fit_and_bad_arguments_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="does not fit"):
        find_batch_size(Capped(limit=0), lambda n: torch.zeros(n, 4), free=no_gc)
    with pytest.raises(UsageError, match="margin"):
        find_batch_size(Capped(limit=4), lambda n: torch.zeros(n, 4), margin=1.5, free=no_gc)


def test_errors_that_are_not_out_of_memory_propagate() -> None:
    def broken(n: int) -> torch.Tensor:
        raise ValueError("bad sample")

    with pytest.raises(ValueError, match="bad sample"):
        find_batch_size(Capped(limit=4), broken, free=no_gc)
