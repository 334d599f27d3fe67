"""Run every doctor check over the gathered facts and rank the findings."""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from trainmedic.doctor.checks import Check
from trainmedic.doctor.facts import MachineFacts
from trainmedic.findings.model import Finding, rank_findings

# One module per category family; each exports ``CHECKS``. Order is the order
# the checks run in; the report is ranked afterwards, so it does not matter.
CHECK_MODULES = (
    "inventory",
    "driver",
    "thermal",
    "hardware",
    "gpu_contention",
    "cpu",
    "host_memory",
    "host_contention",
    "framework",
    "io",
    "network",
)


def all_checks() -> list[Check]:
    """Every check of every module in :data:`CHECK_MODULES`."""
    checks: list[Check] = []
    for name in CHECK_MODULES:
        module = importlib.import_module(f"trainmedic.doctor.checks.{name}")
        checks.extend(module.CHECKS)
    return checks


def run_checks(facts: MachineFacts, checks: Sequence[Check] | None = None) -> list[Finding]:
    """Apply ``checks`` (default: all) to ``facts``; most important finding first."""
    findings: list[Finding] = []
    for check in checks if checks is not None else all_checks():
        findings.extend(check(facts))
    return rank_findings(findings)
