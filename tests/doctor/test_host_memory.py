"""Host memory checks: low available RAM, container limit, OOM kills, swap."""

from __future__ import annotations

from typing import Any

from support.facts import GIB, finding_keys, make_facts, make_host_facts, make_memory_facts
from trainmedic.doctor.checks.host_memory import (
    CHECKS,
    check_cgroup_near_limit,
    check_container_limit,
    check_low_available,
    check_oom_kills,
    check_swap,
)
from trainmedic.doctor.facts import MachineFacts
from trainmedic.findings.model import Category

MIB = 1 << 20


def facts_with(**memory: Any) -> MachineFacts:
    return make_facts(host=make_host_facts(memory=make_memory_facts(**memory)))


def test_healthy_host_gives_no_memory_finding() -> None:
    facts = make_facts()
    assert [f for check in CHECKS for f in check(facts)] == []


def test_low_available_memory_warns_under_the_cpu_category() -> None:
    [f] = check_low_available(facts_with(total_bytes=64 * GIB, available_bytes=3 * GIB))
    assert (f.id, f.category, f.severity.value) == (
        "cpu.host_memory.low_available",
        Category.CPU,
        "warning",
    )
    assert f.evidence["available_gib"] == 3.0
    assert f.evidence["threshold_gib"] == 4.0  # min(6.4 GiB, 4 GiB)
    assert "num_workers" in f.fix


def test_low_available_needs_both_a_small_share_and_few_gib() -> None:
    # 8 GiB on a 1 TiB host is under 4 % but above 4 GiB; 3 GiB of 16 GiB is above 10 %.
    assert check_low_available(facts_with(total_bytes=1024 * GIB, available_bytes=8 * GIB)) == []
    assert check_low_available(facts_with(total_bytes=16 * GIB, available_bytes=3 * GIB)) == []
    [f] = check_low_available(facts_with(total_bytes=16 * GIB, available_bytes=1 * GIB))
    assert f.evidence["threshold_gib"] == 1.6


def test_working_set_near_the_container_limit_warns() -> None:
    facts = facts_with(
        cgroup_limit_bytes=32 * GIB,
        cgroup_usage_bytes=31 * GIB,
        cgroup_working_set_bytes=30 * GIB,
    )
    [f] = check_cgroup_near_limit(facts)
    assert f.id == "cpu.host_memory.cgroup_near_limit"
    assert f.evidence["room_gib"] == 2.0
    assert f.evidence["threshold_gib"] == 3.2
    assert "--memory" in f.fix


def test_page_cache_under_the_limit_does_not_count() -> None:
    # Usage at the limit, but most of it is reclaimable page cache.
    facts = facts_with(
        cgroup_limit_bytes=32 * GIB,
        cgroup_usage_bytes=32 * GIB,
        cgroup_working_set_bytes=10 * GIB,
    )
    assert check_cgroup_near_limit(facts) == []


def test_oom_kills_in_the_container_warn() -> None:
    [f] = check_oom_kills(facts_with(cgroup_oom_kills=3, cgroup_limit_bytes=16 * GIB))
    assert f.id == "cpu.host_memory.oom_kills"
    assert f.evidence == {"cgroup_oom_kills": 3, "cgroup_limit_gib": 16.0}
    assert check_oom_kills(facts_with(cgroup_oom_kills=0)) == []


def test_container_limit_below_host_ram_is_info() -> None:
    findings = check_container_limit(facts_with(cgroup_limit_bytes=16 * GIB))
    assert finding_keys(findings) == {("cpu.host_memory.container_limit", "info", "host")}
    assert "16.0 GiB" in findings[0].fix
    assert check_container_limit(facts_with(cgroup_limit_bytes=None)) == []


def test_active_swapping_warns() -> None:
    facts = facts_with(
        swap_total_bytes=8 * GIB,
        swap_used_bytes=2 * GIB,
        swap_in_bytes_per_s=6.0 * MIB,
        swap_out_bytes_per_s=2.0 * MIB,
    )
    [f] = check_swap(facts)
    assert (f.id, f.severity.value) == ("cpu.host_memory.swapping", "warning")
    assert f.evidence["swap_in_mib_per_s"] == 6.0
    assert "8.0 MiB/s" in f.title


def test_swap_used_while_memory_is_short_warns() -> None:
    facts = facts_with(
        total_bytes=64 * GIB,
        available_bytes=8 * GIB,
        swap_total_bytes=8 * GIB,
        swap_used_bytes=3 * GIB,
    )
    assert finding_keys(check_swap(facts)) == {("cpu.host_memory.swap_used", "warning", "host")}


def test_old_swapped_pages_with_plenty_of_memory_are_info() -> None:
    facts = facts_with(swap_total_bytes=8 * GIB, swap_used_bytes=1 * GIB)
    assert finding_keys(check_swap(facts)) == {("cpu.host_memory.swap_used", "info", "host")}


def test_a_little_swap_is_quiet() -> None:
    facts = facts_with(swap_total_bytes=8 * GIB, swap_used_bytes=100 * MIB)
    assert check_swap(facts) == []
