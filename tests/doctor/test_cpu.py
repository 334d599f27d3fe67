"""CPU checks: usable cores below os.cpu_count(), cgroup throttling, thread variables."""

from __future__ import annotations

from typing import Any

import pytest

from support.facts import finding_keys, make_cpu_facts, make_facts, make_host_facts
from trainmedic.doctor.checks.cpu import (
    CHECKS,
    check_thread_env,
    check_throttling,
    check_usable_cores,
    parse_thread_count,
)
from trainmedic.doctor.facts import MachineFacts
from trainmedic.findings.model import Category, Finding


def facts_with(env: dict[str, str] | None = None, **cpu: Any) -> MachineFacts:
    return make_facts(host=make_host_facts(cpu=make_cpu_facts(**cpu), env=env or {}))


def run_all(facts: MachineFacts) -> list[Finding]:
    return [f for check in CHECKS for f in check(facts)]


def test_healthy_host_gives_no_cpu_finding() -> None:
    assert run_all(make_facts()) == []


def test_cgroup_quota_below_cpu_count_warns_and_suggests_omp_threads() -> None:
    [f] = check_usable_cores(facts_with(cgroup_quota_cores=4.0))
    assert (f.id, f.severity.value, f.category) == (
        "cpu.usable_below_logical",
        "warning",
        Category.CPU,
    )
    assert f.evidence["usable_cores"] == 4.0
    assert f.evidence["logical_cores"] == 32
    assert "quota is 4 cores" in f.title
    assert "OMP_NUM_THREADS=4" in f.fix


def test_affinity_below_cpu_count_warns() -> None:
    [f] = check_usable_cores(facts_with(affinity_cores=8))
    assert f.evidence["usable_cores"] == 8.0
    assert "affinity allows 8" in f.title


def test_usable_cores_take_the_smaller_of_affinity_and_quota() -> None:
    [f] = check_usable_cores(facts_with(affinity_cores=16, cgroup_quota_cores=2.5))
    assert f.evidence["usable_cores"] == 2.5
    assert "OMP_NUM_THREADS=2 " in f.fix


def test_omp_threads_already_fitting_turns_the_finding_into_info() -> None:
    [f] = check_usable_cores(facts_with(env={"OMP_NUM_THREADS": "4"}, cgroup_quota_cores=4.0))
    assert f.severity.value == "info"
    assert "export OMP_NUM_THREADS" not in f.fix


def test_small_gap_between_quota_and_cpu_count_is_quiet() -> None:
    # 32 / 28 = 1.14: a few extra threads, below the 1.25 oversubscription ratio.
    assert check_usable_cores(facts_with(cgroup_quota_cores=28.0)) == []


def test_throttled_share_above_five_percent_warns() -> None:
    [f] = check_throttling(
        facts_with(
            cgroup_quota_cores=4.0, total_periods=10_000, throttled_periods=1_200, throttled_s=95.0
        )
    )
    assert f.id == "cpu.cgroup_throttled"
    assert f.evidence["throttled_share_pct"] == 12.0
    assert f.evidence["throttled_s"] == 95.0
    assert "--cpus" in f.fix


@pytest.mark.parametrize(
    ("periods", "throttled"),
    [(10_000, 400), (50, 40), (None, None)],
    ids=["below-threshold", "too-few-periods", "no-cgroup"],
)
def test_throttling_stays_quiet(periods: int | None, throttled: int | None) -> None:
    facts = facts_with(total_periods=periods, throttled_periods=throttled)
    assert check_throttling(facts) == []


def test_thread_variable_above_usable_cores_warns() -> None:
    facts = facts_with(
        env={"OMP_NUM_THREADS": "16", "MKL_NUM_THREADS": "4"}, cgroup_quota_cores=4.0
    )
    [f] = check_thread_env(facts)
    assert f.id == "cpu.thread_env_oversubscribed"
    assert f.evidence == {"omp_num_threads": 16, "usable_cores": 4.0}
    assert "OMP_NUM_THREADS=4" in f.fix
    assert "MKL" not in f.title


def test_thread_variable_rounding_up_a_fractional_quota_is_fine() -> None:
    assert check_thread_env(facts_with(env={"OMP_NUM_THREADS": "3"}, cgroup_quota_cores=2.5)) == []


def test_invalid_thread_variable_warns_that_it_is_ignored() -> None:
    findings = check_thread_env(facts_with(env={"OPENBLAS_NUM_THREADS": "auto"}))
    assert finding_keys(findings) == {("cpu.thread_env_invalid", "warning", "host")}
    assert findings[0].evidence == {"openblas_num_threads": "auto"}


@pytest.mark.parametrize(
    ("value", "expected"),
    [("8", 8), (" 8 ", 8), ("8,4", 8), ("0", None), ("-2", None), ("", None), ("x", None)],
)
def test_parse_thread_count(value: str, expected: int | None) -> None:
    assert parse_thread_count(value) == expected
