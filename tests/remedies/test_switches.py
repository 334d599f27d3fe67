"""When the torch switches are planned and applied: decided on facts, tested without a GPU."""

from __future__ import annotations

import pytest

from trainmedic.remedies.apply.switches import (
    RunEvidence,
    RuntimeFacts,
    plan_switches,
    runtime_decision,
)


@pytest.mark.parametrize(
    ("evidence", "planned"),
    [
        (RunEvidence(True, 0.9, (8, 0), ("model.no_mixed_precision",)),
         {"tf32_matmul": True, "cudnn_benchmark": True}),
        (RunEvidence(True, 0.3, (8, 0), ("model.no_mixed_precision",)), {"tf32_matmul": True}),
        (RunEvidence(True, 0.9, (7, 0), ("model.no_mixed_precision",)), {"cudnn_benchmark": True}),
        (RunEvidence(True, 0.9, (9, 0)), {"cudnn_benchmark": True}),
        (RunEvidence(False, None, None), {}),
        (RunEvidence(None, 0.95, None), {}),
    ],
)  # fmt: skip
def test_plan(evidence: RunEvidence, planned: dict[str, bool]) -> None:
    got, reasons = plan_switches(evidence)
    assert got == planned
    assert set(reasons) == {"tf32_matmul", "cudnn_benchmark"}  # every decision explained


CUDA = RuntimeFacts(cuda_build=True)


@pytest.mark.parametrize(
    ("switch", "facts", "decision", "why"),
    [
        ("tf32_matmul", RuntimeFacts(cuda_build=False), False, "CPU build"),
        ("tf32_matmul", CUDA, True, "TF32"),
        ("tf32_matmul", RuntimeFacts(True, matmul_precision="medium"), False, "'medium'"),
        ("cudnn_benchmark", CUDA, None, "watching"),
        ("cudnn_benchmark", RuntimeFacts(True, shapes_fixed=True), True, "fixed input shapes"),
        ("cudnn_benchmark", RuntimeFacts(True, shapes_fixed=False), False, "shapes vary"),
        ("cudnn_benchmark", RuntimeFacts(True, deterministic=True, shapes_fixed=True), False,
         "deterministic"),
        ("cudnn_benchmark", RuntimeFacts(True, cudnn_benchmark=True), False, "already"),
        ("cudnn_benchmark", RuntimeFacts(cuda_build=False, shapes_fixed=True), False, "CPU build"),
    ],
)  # fmt: skip
def test_runtime_decision(
    switch: str, facts: RuntimeFacts, decision: bool | None, why: str
) -> None:
    got, reason = runtime_decision(switch, facts)
    assert got is decision
    assert why in reason
