"""The remedy API a training script reads, and its lazy export from trainmedic."""

from __future__ import annotations

import subprocess
import sys

import pytest

import trainmedic
from trainmedic.errors import UsageError
from trainmedic.remedy_api import (
    MicroBatchPlan,
    active_remedies,
    apply_sharing_strategy,
    grad_accum_multiplier,
    max_num_workers,
    micro_batch_divisor,
    micro_batch_plan,
    remedy,
    sharing_strategy,
)


def test_no_remedy_means_neutral_values() -> None:
    env: dict[str, str] = {}
    assert micro_batch_divisor(env) == 1
    assert grad_accum_multiplier(env) == 1
    assert micro_batch_plan(64, env) == MicroBatchPlan(64, 1, 1)
    assert max_num_workers(8, env) == 8
    assert sharing_strategy(env) is None
    assert active_remedies(env) == {}


@pytest.mark.parametrize(
    ("batch_size", "divisor", "micro", "steps"),
    [(64, 2, 32, 2), (64, 4, 16, 4), (10, 4, 2, 5), (6, 4, 1, 6), (7, 2, 1, 7), (3, 16, 1, 3)],
)
def test_micro_batch_plan_keeps_the_effective_batch_exact(
    batch_size: int, divisor: int, micro: int, steps: int
) -> None:
    plan = micro_batch_plan(batch_size, {"TRAINMEDIC_MICRO_BATCH_DIVISOR": str(divisor)})
    assert (plan.micro_batch_size, plan.accumulation_steps) == (micro, steps)
    assert plan.micro_batch_size * plan.accumulation_steps == batch_size
    assert plan.micro_batch_size <= max(1, batch_size // divisor)


def test_grad_accum_defaults_to_the_divisor_and_can_be_set_apart() -> None:
    assert grad_accum_multiplier({"TRAINMEDIC_MICRO_BATCH_DIVISOR": "4"}) == 4
    env = {"TRAINMEDIC_MICRO_BATCH_DIVISOR": "4", "TRAINMEDIC_GRAD_ACCUM": "2"}
    assert grad_accum_multiplier(env) == 2


def test_worker_cap_and_sharing_strategy() -> None:
    env = {"TRAINMEDIC_MAX_NUM_WORKERS": "2", "TRAINMEDIC_SHARING_STRATEGY": "file_system"}
    assert max_num_workers(8, env) == 2
    assert max_num_workers(1, env) == 1
    assert max_num_workers(8, {"TRAINMEDIC_MAX_NUM_WORKERS": "0"}) == 0
    assert sharing_strategy(env) == "file_system"
    assert active_remedies(env) == {"max_num_workers": "2", "sharing_strategy": "file_system"}
    assert remedy("max_num_workers", env) == "2"
    assert remedy("micro_batch", env) is None


def test_apply_sharing_strategy_sets_torch() -> None:
    import torch.multiprocessing

    before = torch.multiprocessing.get_sharing_strategy()
    try:
        assert (
            apply_sharing_strategy({"TRAINMEDIC_SHARING_STRATEGY": "file_system"}) == "file_system"
        )
        assert torch.multiprocessing.get_sharing_strategy() == "file_system"
        assert apply_sharing_strategy({}) is None
    finally:
        torch.multiprocessing.set_sharing_strategy(before)


@pytest.mark.parametrize(
    ("env", "call"),
    [
        ({"TRAINMEDIC_MICRO_BATCH_DIVISOR": "two"}, lambda e: micro_batch_divisor(e)),
        ({"TRAINMEDIC_MICRO_BATCH_DIVISOR": "0"}, lambda e: micro_batch_divisor(e)),
        ({"TRAINMEDIC_MAX_NUM_WORKERS": "-1"}, lambda e: max_num_workers(4, e)),
        ({"TRAINMEDIC_SHARING_STRATEGY": "shm"}, lambda e: sharing_strategy(e)),
        ({}, lambda e: remedy("bigger_gpu", e)),
        ({}, lambda e: micro_batch_plan(0, e)),
    ],
)
def test_malformed_values_are_usage_errors_naming_the_variable(
    env: dict[str, str], call: object
) -> None:
    with pytest.raises(UsageError):
        call(env)  # type: ignore[operator]


def test_reads_the_process_environment_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINMEDIC_MICRO_BATCH_DIVISOR", "8")
    assert trainmedic.micro_batch_divisor() == 8
    assert trainmedic.micro_batch_plan(32).micro_batch_size == 4
    assert trainmedic.remedy("micro_batch") == "8"


def test_lazy_exports_do_not_import_torch() -> None:
    code = (
        "import sys, trainmedic\n"
        "trainmedic.micro_batch_plan(8); trainmedic.max_num_workers(2)\n"
        "c = trainmedic.Checkpointer\n"
        "print('torch' in sys.modules, c.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "trainmedic.checkpoint.checkpointer"]
    for name in (
        "Checkpointer",
        "micro_batch_divisor",
        "micro_batch_plan",
        "max_num_workers",
        "remedy",
    ):
        assert name in trainmedic.__all__
