"""scripts/gpu-check's time budget: every part's limit, with its kill-after seconds and
the reserve, fits in the deadline, so no part is cut short by those before it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-check"


def constants(text: str) -> dict[str, int]:
    """``NAME=123`` and ``NAME=${ENV:-123}`` assignments at the start of a line."""
    found = re.findall(r"^([A-Z_]+)=(?:\$\{[A-Z_]+:-)?(\d+)\}?\b", text, re.MULTILINE)
    return {name: int(value) for name, value in found}


def part_limits(text: str) -> dict[str, int]:
    """Each ``run_part NAME "$BUDGET_..."`` call's part and its limit, seconds."""
    values = constants(text)
    calls = re.findall(r"run_part (\S+) \"\$(BUDGET_[A-Z_]+)\"", text)
    return {part: values[budget] for part, budget in calls}


def worst_case_s(text: str) -> int:
    """Seconds gpu-check takes when every part runs to its limit and ignores SIGTERM."""
    values = constants(text)
    limits = part_limits(text)
    return sum(limits.values()) + len(limits) * values["KILL_AFTER_S"] + values["RESERVE_S"]


def test_every_part_with_its_kill_after_and_the_reserve_fits_in_the_deadline() -> None:
    text = SCRIPT.read_text()
    limits = part_limits(text)
    assert set(limits) == {
        "preflight", "nvidia-smi", "doctor", "run", "gpu", "stress", "probe", "slow"
    }  # fmt: skip
    budgets = {k for k in constants(text) if k.startswith("BUDGET_")}
    assert budgets == set(re.findall(r"run_part \S+ \"\$(BUDGET_[A-Z_]+)\"", text))
    deadline = constants(text)["DEADLINE_S"]
    assert worst_case_s(text) <= deadline, (worst_case_s(text), deadline, limits)
    # The comment states the sum the constants give.
    total = sum(limits.values())
    terms = "+".join(str(v) for v in limits.values())
    assert f"{terms} = {total} s" in " ".join(text.split())


@pytest.mark.parametrize("grown", ["BUDGET_PROBE_S", "RESERVE_S", "KILL_AFTER_S"])
def test_the_sum_fails_when_a_limit_grows_past_the_deadline(grown: str) -> None:
    text = SCRIPT.read_text()
    deadline = constants(text)["DEADLINE_S"]
    bigger = re.sub(rf"^{grown}=(\d+)", lambda m: f"{grown}={int(m[1]) + 40}", text, flags=re.M)
    assert worst_case_s(bigger) > deadline
