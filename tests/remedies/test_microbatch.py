"""Micro-batching on out-of-memory errors: the update equals the full batch's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainmedic.remedies.microbatch import MicroBatchError, MicroBatchStep

OOM_TEXT = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"


def no_gc() -> None:
    """The logic under test does not need the full garbage collection (0.1-0.2 s each)."""


def make_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def make_batch(n: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


class Limited:
    """A loss function that runs out of memory above ``limit`` samples (as an allocator would)."""

    def __init__(self, model: nn.Module, limit: int, reduction: str = "mean") -> None:
        self.model = model
        self.limit = limit
        self.reduction = reduction
        self.sizes: list[int] = []

    def __call__(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        self.sizes.append(len(x))
        if len(x) > self.limit:
            raise RuntimeError(OOM_TEXT)
        return nn.functional.cross_entropy(self.model(x), y, reduction=self.reduction)


def full_batch_grads(reduction: str = "mean") -> list[torch.Tensor]:
    model = make_model()
    x, y = make_batch()
    nn.functional.cross_entropy(model(x), y, reduction=reduction).backward()
    return [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]


def grads_after_step(step: MicroBatchStep, model: nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_out_of_memory_splits_the_batch_and_the_gradients_equal_the_full_batchs(
    reduction: str,
) -> None:
    model = make_model()
    loss_fn = Limited(model, limit=5, reduction=reduction)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: grads stay comparable
    step = MicroBatchStep(loss_fn, opt, reduction=reduction, environ={}, free=no_gc)
    loss = step(make_batch())
    assert loss_fn.sizes[:1] == [12]  # the whole batch was tried first
    assert step.micro_batch_size == 3  # 12 -> 6 -> 3
    assert step.accumulation_steps == 4
    for got, want in zip(grads_after_step(step, model), full_batch_grads(reduction), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    x, y = make_batch()
    expected = nn.functional.cross_entropy(make_model()(x), y, reduction=reduction)
    torch.testing.assert_close(loss, expected.detach(), rtol=1e-5, atol=1e-6)


def test_uneven_parts_are_weighted_by_their_share() -> None:
    model = make_model()
    loss_fn = Limited(model, limit=5)  # 12 -> 6 fails, -> 5 ... halving gives 6, 3
    step = MicroBatchStep(
        loss_fn, torch.optim.SGD(model.parameters(), lr=0.0), environ={}, free=no_gc
    )
    step.micro_batch_size = 5  # parts of 5, 5, 2
    step(make_batch())
    assert loss_fn.sizes == [5, 5, 2]
    for got, want in zip(grads_after_step(step, model), full_batch_grads(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_working_size_is_remembered_and_grows_back_after_good_steps() -> None:
    model = make_model()
    loss_fn = Limited(model, limit=6)
    step = MicroBatchStep(
        loss_fn, torch.optim.SGD(model.parameters(), lr=0.01), grow_after=3, environ={}, free=no_gc
    )
    step(make_batch())  # good step 1 at the reduced size
    assert step.micro_batch_size == 6
    loss_fn.sizes.clear()
    for _ in range(2):
        step(make_batch())
    assert loss_fn.sizes == [6, 6] * 2  # no more failed attempts
    loss_fn.limit = 12  # memory freed up: the next step tries the whole batch again
    loss_fn.sizes.clear()
    step(make_batch())
    assert loss_fn.sizes == [12]
    assert step.micro_batch_size is None


def test_a_growth_that_fails_waits_twice_as_long_before_the_next() -> None:
    model = make_model()
    loss_fn = Limited(model, limit=6)
    step = MicroBatchStep(
        loss_fn, torch.optim.SGD(model.parameters(), lr=0.01), grow_after=2, environ={}, free=no_gc
    )
    for _ in range(3):
        step(make_batch())
    assert step.grow_after == 4  # grew at step 3, failed, backed off
    assert step.micro_batch_size == 6
    assert [o.ok for o in step.history] == [False, True, True, False, True]


def test_the_restart_policys_divisor_starts_at_the_divided_size() -> None:
    model = make_model()
    loss_fn = Limited(model, limit=100)
    step = MicroBatchStep(
        loss_fn,
        torch.optim.SGD(model.parameters(), lr=0.01),
        environ={"TRAINMEDIC_MICRO_BATCH_DIVISOR": "4"},
        free=no_gc,
    )
    step(make_batch())
    assert loss_fn.sizes == [3, 3, 3, 3]


def test_one_sample_that_does_not_fit_is_an_error_naming_the_remedies() -> None:
    model = make_model()
    step = MicroBatchStep(
        Limited(model, limit=0),
        torch.optim.SGD(model.parameters(), lr=0.01),
        environ={},
        free=no_gc,
    )
    with pytest.raises(MicroBatchError, match="micro-batch of 1 sample"):
        step(make_batch(4))


def test_errors_other_than_out_of_memory_pass_through_untouched() -> None:
    model = make_model()

    def broken(batch: object) -> torch.Tensor:
        raise ValueError("a bug in the loss")

    step = MicroBatchStep(
        broken, torch.optim.SGD(model.parameters(), lr=0.01), environ={}, free=no_gc
    )
    with pytest.raises(ValueError, match="a bug in the loss"):
        step(make_batch())
    assert step.history == []


def test_grad_scaler_scales_every_part_and_steps_once() -> None:
    model = make_model()
    reference = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    clipped: list[bool] = []
    step = MicroBatchStep(
        Limited(model, limit=4),
        opt,
        scaler=scaler,
        before_step=lambda: clipped.append(True),
        environ={},
        free=no_gc,
    )
    step(make_batch())
    x, y = make_batch()
    nn.functional.cross_entropy(reference(x), y).backward()
    ref_opt.step()
    for got, want in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert clipped == [True]  # once, after unscale_
    assert scaler.get_scale() == 1024.0  # no inf/nan: the scale stays


def test_without_an_optimizer_the_model_zeroes_and_the_caller_steps() -> None:
    model = make_model()
    step = MicroBatchStep(Limited(model, limit=4), None, model=model, environ={}, free=no_gc)
    step(make_batch())
    for got, want in zip(grads_after_step(step, model), full_batch_grads(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
