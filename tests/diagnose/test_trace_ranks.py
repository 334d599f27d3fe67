"""One job's ranks compared from their traces (trainmedic.diagnose.trace_ranks): the rank
the others wait for, by its GPU work or its wait for data, and what is not one job."""

from __future__ import annotations

import dataclasses

import pytest

from trainmedic.diagnose.trace_ranks import compare_ranks, one_job, per_rank
from trainmedic.findings.model import Category, Severity
from trainmedic.traces.kineto import Device, TraceStep, TraceSummary

STEP_US = 100_000.0


def rank(r: int, compute_us: float, exposed_us: float, data_us: float = 50.0,
         world: int | None = 4) -> TraceSummary:  # fmt: skip
    """Rank ``r``: 100 ms steps of ``compute_us`` GPU work and ``exposed_us`` of NCCL alone."""
    busy = compute_us + exposed_us
    steps = tuple(
        TraceStep(i, i * STEP_US, STEP_US, gpu_busy_us=busy, exposed_nccl_us=exposed_us,
                  nccl_us=exposed_us + 5000, data_us=data_us)
        for i in range(5)
    )
    return TraceSummary(f"r{r}.json", 100, steps, Device(0, "NVIDIA A100"), rank=r,
                        world_size=world)  # fmt: skip


def test_the_rank_with_more_gpu_work_is_the_one_the_others_wait_for() -> None:
    # Rank 2 computes 80 ms; the others 55 ms and then sit 25 ms in the all-reduce for it.
    traces = [rank(0, 55_000, 27_000), rank(1, 55_000, 26_000), rank(2, 80_000, 2_000),
              rank(3, 56_000, 25_000)]  # fmt: skip
    (f,) = compare_ranks(traces)
    assert (f.id, f.category, f.subject) == ("distributed.gpu_imbalance",
                                            Category.GPU_CAPACITY, "rank2")  # fmt: skip
    assert f.evidence["others_gpu_compute_ms"] == pytest.approx(55.0)
    assert f.evidence["others_wait_ms_per_step"] == pytest.approx(25.0)
    assert f.impact == pytest.approx(0.25) and f.severity is Severity.WARNING
    assert "Rank 2's GPU computes 80.0 ms a step" in f.title and "rank 2" in f.fix


def test_the_rank_that_waits_for_its_batches_is_a_data_straggler() -> None:
    traces = [rank(0, 60_000, 20_000), rank(1, 60_000, 20_000, data_us=18_000),
              rank(2, 60_000, 20_000), rank(3, 60_000, 21_000)]  # fmt: skip
    (f,) = compare_ranks(traces)
    assert (f.id, f.subject) == ("distributed.straggler.data", "rank1")
    assert f.impact == pytest.approx(0.1795, abs=1e-3) and f.severity is Severity.INFO


def test_even_ranks_are_not_compared_into_a_finding() -> None:
    # A few percent apart: noise between GPUs, not a straggler.
    traces = [rank(0, 60_000, 20_000), rank(1, 63_000, 18_000), rank(2, 61_000, 19_000)]
    assert compare_ranks(traces) == []
    assert [r["rank"] for r in per_rank(traces)] == [0, 1, 2]


def test_what_is_not_one_jobs_ranks_is_judged_trace_by_trace() -> None:
    a, b = rank(0, 55_000, 27_000), rank(1, 90_000, 0)
    assert one_job([a, b])
    assert not one_job([a])
    assert not one_job([a, dataclasses.replace(b, rank=0)])  # the same rank twice
    assert not one_job([a, dataclasses.replace(b, world_size=8)])  # two jobs
    assert not one_job([a, dataclasses.replace(b, rank=None)])  # not distributed
    assert not one_job([a, dataclasses.replace(b, steps=())])
    assert compare_ranks([a, dataclasses.replace(b, world_size=8)]) == []
