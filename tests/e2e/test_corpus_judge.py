"""How the corpus judge reads a run on a shared machine (tests/e2e/corpus.py), on
findings written out by hand: fast, so the rules that decide pass, skip and fail
are themselves tested."""

from __future__ import annotations

from typing import Any

from .corpus import BY_NAME, judge


def _contention_error(others_cores: float) -> dict[str, Any]:
    return {
        "id": "contention.cpu", "category": "contention", "severity": "error", "impact": 0.267,
        "evidence": {"train_cpu_wait_share": 0.267, "others_cpu_cores": others_cores},
    }  # fmt: skip


def _more_producers() -> dict[str, Any]:
    return {
        "id": "input.workers", "category": "framework_config", "severity": "warning",
        "impact": 0.336,
        "evidence": {"helper_resource": "cpu", "helpers": "processes",
                     "recommended_processes": 2, "helper_processes_seen": 1.0},
    }  # fmt: skip


def test_a_measured_quarter_lost_to_others_third_of_a_core_is_the_machines() -> None:
    # A job filling 2 cores waited for a CPU 27 % of its time while others took a
    # third of a core: the case's own finding, next in line, is the one judged.
    got = judge(BY_NAME["processes-compute"], [_contention_error(0.345), _more_producers()])
    assert got.result == "match" and got.first is not None
    assert got.first["id"] == "input.workers"


def test_a_contention_error_without_others_load_is_not_excused() -> None:
    got = judge(BY_NAME["processes-compute"], [_contention_error(0.1), _more_producers()])
    assert got.result == "mismatch"
    assert got.first is not None and got.first["id"] == "contention.cpu"


def test_the_machines_error_without_the_cases_finding_is_busy() -> None:
    got = judge(BY_NAME["processes-compute"], [_contention_error(0.345)])
    assert got.result == "busy"


def _oversubscribed() -> dict[str, Any]:
    return {
        "id": "cpu.oversubscribed", "category": "cpu", "severity": "error", "impact": 0.256,
        "evidence": {"train_cpu_wait_share": 0.256, "others_cpu_cores": 0.2},
    }  # fmt: skip


def test_a_job_that_filled_every_core_cannot_show_a_case_whose_fix_needs_a_spare_one() -> None:
    got = judge(BY_NAME["processes-compute"], [_oversubscribed(), _more_producers()])
    assert got.result == "busy"
    assert got.first is not None and got.first["id"] == "cpu.oversubscribed"


def test_oversubscription_without_the_cases_finding_is_a_mismatch() -> None:
    got = judge(BY_NAME["processes-compute"], [_oversubscribed()])
    assert got.result == "mismatch"
