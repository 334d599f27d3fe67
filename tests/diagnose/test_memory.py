"""GPU memory pressure: OOMs, allocator retries, memory near full."""

from __future__ import annotations

from dataclasses import replace

import pytest

from support.builders import GIB, make_event, make_gpu_series, make_record, make_steps
from trainmedic.diagnose.memory import memory_pressure
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.record.types import RunRecord

TH = Thresholds()


def memory_record(
    *,
    reserved_gib: float = 40.0,
    used_gib: float = 42.0,
    retries: list[int] | None = None,
    ooms: int = 0,
) -> RunRecord:
    steps = make_steps(50, 0.2, reserved_peak_bytes=int(reserved_gib * GIB), ooms=ooms)
    if retries is not None:
        steps = [replace(s, alloc_retries=r) for s, r in zip(steps, retries, strict=True)]
    return make_record(steps, gpu=make_gpu_series(10, memory_used_bytes=int(used_gib * GIB)))


def run(record: RunRecord) -> list[Finding]:
    return memory_pressure(RunView.of(record), TH)


def test_healthy_memory_is_quiet() -> None:
    assert run(memory_record()) == []


def test_oom_counter_is_an_error() -> None:
    (f,) = run(memory_record(ooms=1))
    assert f.id == "memory.oom" and f.severity is Severity.ERROR
    assert f.category is Category.GPU_MEMORY and f.evidence["ooms"] == 1
    assert "gradient accumulation" in f.fix and "expandable_segments:True" in f.fix


def test_oom_exception_event_is_an_error() -> None:
    event = make_event(
        "exception", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    )
    record = memory_record()
    record.events.append(event)
    (f,) = run(record)
    assert f.id == "memory.oom" and f.evidence["oom_events"] == 1


def test_growing_retries_in_steady_steps_cost_their_extra_time() -> None:
    retries = [0] * 20 + [1] + [1] * 9 + [2] + [2] * 19  # two steps with a cache flush
    record = memory_record(retries=retries)
    steps = record.steps
    for i in (20, 30):  # those steps took 0.6 s instead of 0.2 s
        steps[i] = replace(steps[i], duration_s=0.6)
    (f,) = run(record)
    assert f.id == "memory.alloc_retries" and f.severity is Severity.WARNING
    assert f.evidence["steps_with_retries"] == 2 and f.evidence["alloc_retries_added"] == 2
    assert f.evidence["steps_with_retries_first"] == [21, 31]
    assert f.impact == pytest.approx(0.8 / (48 * 0.2 + 2 * 0.6))


def test_retries_that_only_happened_before_the_run_steadied_are_quiet() -> None:
    assert run(memory_record(retries=[3] * 50)) == []


@pytest.mark.parametrize(("used", "fires"), [(75.9, False), (76.0, True)])
def test_used_memory_edge(used: float, fires: bool) -> None:
    # 95 % of 80 GiB is 76 GiB
    found = run(memory_record(used_gib=used))
    assert [f.id for f in found] == (["memory.near_capacity"] if fires else [])


def test_reserved_peak_near_total_fires_with_evidence() -> None:
    (f,) = run(memory_record(reserved_gib=78.0))
    assert f.id == "memory.near_capacity" and f.subject == "gpu0"
    assert f.evidence["reserved_peak_gib"] == pytest.approx(78.0)
    assert f.evidence["memory_peak_share"] == pytest.approx(78 / 80)
    assert f.impact is None
