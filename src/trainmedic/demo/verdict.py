"""Did a demo run give the diagnosis its scenario stands for?"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trainmedic.demo.scenarios import BUSY_MACHINE_INPUT_CAUSE, TOLERATED, Scenario
from trainmedic.findings.model import Finding, Severity


@dataclass(frozen=True)
class Verdict:
    """The outcome of one demo run.

    Attributes:
        ok: the diagnosis is the scenario's.
        message: one sentence saying what was expected and what was found.
        first: the first finding that counts (tolerated ones skipped), if any.
    """

    ok: bool
    message: str
    first: Finding | None


def judge(scenario: Scenario, findings: Sequence[Finding]) -> Verdict:
    """Compare ranked ``findings`` with what ``scenario`` should give.

    Findings in :data:`~trainmedic.demo.scenarios.TOLERATED` (load from other
    people's processes) are skipped: they describe the machine, not the
    scenario. Everything else must match: the expected finding first, as a
    warning or an error with the expected category; or, for a healthy
    scenario, no warning or error at all.
    """
    counted = [f for f in findings if not f.id.startswith(TOLERATED)]
    skipped = [f.id for f in findings if f.id.startswith(TOLERATED)]
    note = (
        f" ({', '.join(sorted(set(skipped)))} also reported: this machine is busy)"
        if skipped
        else ""
    )
    first = counted[0] if counted else None
    if scenario.expected is None:
        problems = [f for f in counted if f.severity is not Severity.INFO]
        if problems:
            worst = problems[0]
            return Verdict(
                False,
                f"expected no warning or error, but trainmedic found {worst.id} "
                f"({worst.severity.value}): {worst.title}",
                worst,
            )
        return Verdict(True, f"no warning or error, as expected{note}", first)
    if first is None:
        return Verdict(False, f"expected {scenario.expected} first, but nothing was found", None)
    matches = (
        first.id == scenario.expected
        and first.category is scenario.category
        and first.severity is not Severity.INFO
    )
    if (
        not matches
        and first.id == BUSY_MACHINE_INPUT_CAUSE
        and scenario.expected.startswith("input.")
        and (first.evidence.get("others_cpu_cores") or 0.0) >= 0.5
    ):
        return Verdict(
            True,
            f"this machine is too busy to show {scenario.expected}: other processes used "
            f"{first.evidence['others_cpu_cores']:.1f} cores and starved the loader, and "
            f"trainmedic said so ({first.id}); run the demo on a quiet machine to see the "
            "scenario's own cause",
            first,
        )
    if matches:
        return Verdict(
            True,
            f"trainmedic named the cause, as expected: {first.id} "
            f"({first.category.value}, {first.severity.value}){note}",
            first,
        )
    return Verdict(
        False,
        f"expected {scenario.expected} ({scenario.category.value}) first, but trainmedic "
        f"found {first.id} ({first.category.value}, {first.severity.value}): {first.title}",
        first,
    )
