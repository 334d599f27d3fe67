"""The demo's verdict: the scenario's finding first, other people's load tolerated."""

from __future__ import annotations

from typing import Any

from trainmedic.demo.scenarios import SCENARIOS
from trainmedic.demo.verdict import judge
from trainmedic.findings.model import Category, Finding, Severity


def make_finding(
    id: str,
    category: Category,
    severity: Severity = Severity.WARNING,
    impact: float | None = 0.3,
    **evidence: Any,
) -> Finding:
    return Finding(id, category, severity, f"title of {id}", evidence, "fix", impact)


HEALTHY = make_finding("run.healthy", Category.CPU, Severity.INFO, 0.0)
CPU_LOAD = make_finding("contention.cpu", Category.CONTENTION, impact=0.4, others_cpu_cores=1.3)
WORKERS = make_finding("input.workers", Category.FRAMEWORK_CONFIG, Severity.ERROR, 0.6)


def test_expected_finding_first_is_ok() -> None:
    verdict = judge(SCENARIOS["input-bound"], [WORKERS, HEALTHY])
    assert verdict.ok
    assert verdict.first is WORKERS
    assert "input.workers" in verdict.message


def test_another_finding_first_is_not_ok_and_named() -> None:
    io = make_finding("input.io", Category.IO, Severity.ERROR, 0.7)
    verdict = judge(SCENARIOS["input-bound"], [io, WORKERS])
    assert not verdict.ok
    assert verdict.first is io
    assert "expected input.workers" in verdict.message and "found input.io" in verdict.message


def test_the_expected_id_as_information_only_is_not_ok() -> None:
    stall = make_finding("stall.framework_config", Category.FRAMEWORK_CONFIG, Severity.INFO, 0.03)
    assert not judge(SCENARIOS["stalls"], [stall]).ok


def test_the_expected_id_with_another_category_is_not_ok() -> None:
    odd = make_finding("input.workers", Category.CPU, Severity.ERROR)
    assert not judge(SCENARIOS["input-bound"], [odd]).ok


def test_other_peoples_cpu_load_is_skipped_but_mentioned() -> None:
    verdict = judge(SCENARIOS["input-bound"], [CPU_LOAD, WORKERS])
    assert verdict.ok
    assert verdict.first is WORKERS
    assert "contention.cpu" in verdict.message


def test_input_bound_named_contention_needs_measured_load_from_others() -> None:
    # A wait blamed on contention without others' CPU measured means the scenario did
    # not show what it stands for.
    crowded = make_finding("input.contention", Category.CONTENTION, Severity.ERROR)
    assert not judge(SCENARIOS["input-bound"], [crowded]).ok
    # With others' load measured, the machine was too busy to show the scenario, and
    # trainmedic was right to say so.
    busy = make_finding(
        "input.contention", Category.CONTENTION, Severity.ERROR, others_cpu_cores=1.3
    )
    verdict = judge(SCENARIOS["input-bound"], [busy])
    assert verdict.ok and "too busy to show input.workers" in verdict.message
    assert not judge(SCENARIOS["slow-storage"], [CPU_LOAD]).ok


def test_healthy_needs_no_warning_or_error() -> None:
    assert judge(SCENARIOS["healthy"], [HEALTHY]).ok
    stall = make_finding("stall.io", Category.IO, Severity.WARNING, 0.1)
    verdict = judge(SCENARIOS["healthy"], [stall, HEALTHY])
    assert not verdict.ok
    assert verdict.first is stall


def test_healthy_on_a_busy_machine_is_ok() -> None:
    # With a contention warning the overall verdict run.healthy is not given.
    verdict = judge(SCENARIOS["healthy"], [CPU_LOAD])
    assert verdict.ok
    assert "busy" in verdict.message


def test_nothing_found_is_not_ok_for_a_bottleneck_scenario() -> None:
    verdict = judge(SCENARIOS["slow-storage"], [])
    assert not verdict.ok and verdict.first is None
