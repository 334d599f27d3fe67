"""GPU contention checks: others' processes, others' load, others' memory."""

from __future__ import annotations

import pytest

from support.facts import (
    GIB,
    USER,
    finding_keys,
    make_facts,
    make_gpu_sample,
    make_loaded_gpu_sample,
    make_process,
)
from trainmedic.doctor.checks.gpu_contention import (
    CHECKS,
    check_busy_without_user,
    check_foreign_processes,
    check_memory_used_by_others,
)
from trainmedic.findings.model import Category


def test_idle_gpu_and_gpu_busy_with_own_job_stay_quiet() -> None:
    facts = make_facts(gpus=[make_gpu_sample(), make_loaded_gpu_sample()])
    assert [f for check in CHECKS for f in check(facts)] == []


def test_other_users_process_is_a_contention_warning() -> None:
    bob = make_process(pid=777, user="bob", used_memory_bytes=30 * GIB, name="python3")
    facts = make_facts(gpus=[make_gpu_sample(), make_gpu_sample(processes=(bob,))])
    (finding,) = check_foreign_processes(facts)
    assert (finding.id, finding.severity.value, finding.subject) == (
        "contention.gpu.foreign_processes",
        "warning",
        "gpu1",
    )
    assert finding.category is Category.CONTENTION
    assert finding.evidence["foreign_processes"] == ["pid 777 (bob, python3, 30.0 GiB)"]
    assert "bob" in finding.title
    # The fix points at the GPU nobody else uses.
    assert "CUDA_VISIBLE_DEVICES=0 " in finding.fix


def test_process_with_invisible_owner_counts_as_foreign() -> None:
    hidden = make_process(pid=31337, user=None, name=None, used_memory_bytes=None)
    (finding,) = check_foreign_processes(make_facts(gpus=[make_gpu_sample(processes=(hidden,))]))
    assert finding.evidence["owner_not_visible_count"] == 1
    assert finding.evidence["foreign_processes"] == ["pid 31337 (owner not visible)"]
    assert "not visible" in finding.title
    assert finding.detail is not None and "container" in finding.detail
    assert "no GPU of this machine is free" in finding.fix


def test_busy_gpu_without_own_process_is_contention_with_impact() -> None:
    bob = make_process(pid=777, user="bob")
    gpu = make_gpu_sample(utilization_gpu_pct=90.0, processes=(bob,))
    (finding,) = check_busy_without_user(make_facts(gpus=[gpu]))
    assert (finding.id, finding.severity.value) == ("contention.gpu.busy_without_user", "warning")
    # One other context: time-slicing leaves the user at least half the GPU.
    assert finding.impact == pytest.approx(0.5)


def test_busy_gpu_with_no_visible_process_is_contention() -> None:
    gpu = make_gpu_sample(utilization_gpu_pct=35.0, processes=())
    (finding,) = check_busy_without_user(make_facts(gpus=[gpu]))
    assert finding.impact == pytest.approx(0.35)
    assert "no process visible" in finding.title


@pytest.mark.parametrize("utilization", [0.0, 19.9, None])
def test_light_load_is_not_contention(utilization: float | None) -> None:
    gpu = make_gpu_sample(utilization_gpu_pct=utilization)
    assert check_busy_without_user(make_facts(gpus=[gpu])) == []


def test_memory_held_by_others_with_free_amount() -> None:
    bob = make_process(pid=777, user="bob", used_memory_bytes=30 * GIB)
    gpu = make_gpu_sample(memory_used_bytes=30 * GIB + 512 * (1 << 20), processes=(bob,))
    (finding,) = check_memory_used_by_others(make_facts(gpus=[gpu]))
    assert (finding.id, finding.category, finding.subject) == (
        "gpu_memory.used_by_others",
        Category.GPU_MEMORY,
        "gpu0",
    )
    assert finding.evidence["used_by_others_gib"] == 30.5
    assert finding.evidence["memory_free_gib"] == pytest.approx(79.65 - 30.5, abs=0.01)


def test_memory_with_no_listed_process_counts_as_others() -> None:
    gpu = make_gpu_sample(memory_used_bytes=20 * GIB, processes=())
    (finding,) = check_memory_used_by_others(make_facts(gpus=[gpu]))
    assert finding.evidence["used_by_others_gib"] == 20.0
    assert finding.detail is not None


def test_own_memory_is_not_counted() -> None:
    mine = make_process(pid=1, user=USER, used_memory_bytes=60 * GIB)
    bob = make_process(pid=2, user="bob", used_memory_bytes=2 * GIB)
    gpu = make_gpu_sample(memory_used_bytes=62 * GIB, processes=(mine, bob))
    # 2 GiB of an 80 GiB GPU is below 5 %: quiet.
    assert check_memory_used_by_others(make_facts(gpus=[gpu])) == []


def test_hidden_foreign_memory_is_what_remains_beyond_own() -> None:
    mine = make_process(pid=1, user=USER, used_memory_bytes=40 * GIB)
    hidden = make_process(pid=2, user=None, used_memory_bytes=None)
    gpu = make_gpu_sample(memory_used_bytes=55 * GIB, processes=(mine, hidden))
    (finding,) = check_memory_used_by_others(make_facts(gpus=[gpu]))
    assert finding.evidence["used_by_others_gib"] == 15.0


@pytest.mark.parametrize(
    ("total_gib", "used_gib", "fires"),
    [
        (8, 0.9, False),  # driver reservation on a small GPU: under 1 GiB
        (8, 1.2, True),  # over 1 GiB and over 5 % of 8 GiB
        (80, 3.5, False),  # over 1 GiB but under 5 % of 80 GiB
        (80, 4.5, True),
    ],
)
def test_memory_threshold_is_1_gib_and_5_percent(
    total_gib: int, used_gib: float, fires: bool
) -> None:
    gpu = make_gpu_sample(memory_total_bytes=total_gib * GIB, memory_used_bytes=int(used_gib * GIB))
    found = check_memory_used_by_others(make_facts(gpus=[gpu]))
    assert bool(found) is fires


def test_all_three_fire_for_a_busy_foreign_tenant() -> None:
    bob = make_process(pid=777, user="bob", used_memory_bytes=40 * GIB)
    gpu = make_gpu_sample(utilization_gpu_pct=100.0, memory_used_bytes=40 * GIB, processes=(bob,))
    facts = make_facts(gpus=[gpu])
    assert finding_keys([f for check in CHECKS for f in check(facts)]) == {
        ("contention.gpu.foreign_processes", "warning", "gpu0"),
        ("contention.gpu.busy_without_user", "warning", "gpu0"),
        ("gpu_memory.used_by_others", "warning", "gpu0"),
    }
