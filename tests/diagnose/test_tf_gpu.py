"""TensorFlow on a GPU: its pool held whole (memory growth off) is not what the job
uses; the memory, small-batch and mixed-precision rules judge TensorFlow's own
figures and speak TensorFlow's words."""

from __future__ import annotations

from typing import Any

import pytest

from support.builders import (
    GIB,
    JOB_PID,
    make_event,
    make_gpu_series,
    make_host_series,
    make_loader,
    make_record,
    make_steps,
)
from trainmedic.diagnose import diagnose_run
from trainmedic.diagnose.memory import memory_pressure
from trainmedic.diagnose.precision import no_mixed_precision
from trainmedic.diagnose.tf_gpu import tf_memory_pool
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.utilization import host_overhead, small_batch
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Severity
from trainmedic.record.types import RunRecord

TH = Thresholds()


def _facts(growth: bool = False, peak_gib: float = 6.0, policy: str = "float32",
           env: bool = False) -> dict[str, Any]:  # fmt: skip
    peak = int(peak_gib * GIB)
    gpu = {"index": 0, "name": "/physical_device:GPU:0", "memory_growth": growth,
           "in_use_bytes": peak * 9 // 10, "peak_bytes": peak}  # fmt: skip
    return {"gpus": [gpu], "growth_env": env, "dtype_policy": policy, "jit_compile": None,
            "auto_jit": None}  # fmt: skip


def _record(
    facts: dict[str, Any] | None,
    *,
    held_gib: float = 78.0,
    util: float = 95.0,
    samples: int = 256,
    pids: tuple[int, ...] = (JOB_PID,),
) -> RunRecord:
    events = [make_event("tf_gpu", **facts)] if facts is not None else []
    return make_record(
        make_steps(100, 0.05, 0.002, samples=samples, compute=0.04),
        gpu=make_gpu_series(8, utilization_gpu_pct=util, memory_used_bytes=int(held_gib * GIB),
                            job_pids=pids, compute_capability=(8, 0)),
        host=make_host_series(8),
        loaders=[make_loader(0, batch_size=samples)],
        events=events,
    )


def test_a_whole_gpu_held_by_the_pool_is_not_memory_near_full() -> None:
    # Without TensorFlow's figures the readings say 98 % full ...
    (near,) = memory_pressure(RunView.of(_record(None)), TH)
    assert near.id == "memory.near_capacity"
    # ... with them, the job used 6 of 80 GiB: no pressure, and the reading is explained.
    view = RunView.of(_record(_facts()))
    assert memory_pressure(view, TH) == []
    assert view.gpu_memory_used_share == pytest.approx(6 / 80)
    (f,) = tf_memory_pool(view, TH)
    assert (f.id, f.severity, f.category) == (
        "memory.tf_whole_gpu", Severity.INFO, Category.GPU_MEMORY)  # fmt: skip
    assert "78.0 of 80.0 GiB" in f.title and "6.0 GiB" in f.title
    assert "TF_FORCE_GPU_ALLOW_GROWTH=true" in f.fix
    assert f.evidence["tf_pool_peak_gib"] == pytest.approx(6.0)


def test_a_second_process_on_the_gpu_makes_it_a_warning() -> None:
    (f,) = tf_memory_pool(RunView.of(_record(_facts(), pids=(JOB_PID, 999))), TH)
    assert f.severity is Severity.WARNING and "2 processes share" in f.title
    assert f.evidence["processes_sharing_a_gpu"] == [999, JOB_PID]


@pytest.mark.parametrize("facts", [_facts(growth=True), _facts(env=True)],
                         ids=["memory-growth", "env"])  # fmt: skip
def test_memory_growth_on_reads_the_gpu_as_it_is(facts: dict[str, Any]) -> None:
    view = RunView.of(_record(facts))
    assert tf_memory_pool(view, TH) == []
    (near,) = memory_pressure(view, TH)  # the GPU really is 98 % full
    assert near.id == "memory.near_capacity" and "dataset.batch(N)" in near.fix
    assert "torch" not in near.fix


def test_a_small_batch_is_seen_through_the_pool_with_tensorflows_fix() -> None:
    view = RunView.of(_record(_facts(peak_gib=8.0), util=30.0, samples=16))
    (f,) = small_batch(view, TH)
    assert f.evidence["gpu_memory_used_share"] == pytest.approx(0.1)
    assert "dataset.batch(128)" in f.fix and "DataLoader" not in f.fix
    # The same job with a batch that is not small: host overhead, in TensorFlow's words.
    (h,) = host_overhead(RunView.of(_record(_facts(peak_gib=40), util=30.0)), TH)
    assert "steps_per_execution" in h.fix and "torch" not in h.fix


@pytest.mark.parametrize(("policy", "fires"), [("float32", True), ("mixed_bfloat16", False)])
def test_full_precision_is_the_dtype_policy(policy: str, fires: bool) -> None:
    found = no_mixed_precision(RunView.of(_record(_facts(policy=policy))), TH)
    assert bool(found) is fires
    if fires:
        (f,) = found
        assert "set_global_policy(\"mixed_bfloat16\")" in f.fix and "jit_compile=True" in f.fix
        assert f.apply is None and f.evidence["tf_dtype_policies"] == ["float32"]


def test_the_run_ranks_tensorflows_findings_without_torch_words() -> None:
    found = diagnose_run(_record(_facts()))
    ids = [f.id for f in found]
    assert "memory.tf_whole_gpu" in ids and "memory.near_capacity" not in ids
    assert not [f for f in found if "torch." in f.fix], [f.fix for f in found]
