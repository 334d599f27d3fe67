"""Failure isolation: a part that raises turns itself off and says so once."""

from __future__ import annotations

import pytest

from trainmedic.probe.parts import PART_NAMES, InjectedFault, Part, Parts


def make_parts(
    disabled: tuple[str, ...] = (), faults: tuple[str, ...] = ()
) -> tuple[Parts, list[str]]:
    reports: list[str] = []
    parts = Parts(disabled, faults, lambda part, exc, tb: reports.append(f"{part.name}: {exc}"))
    return parts, reports


def test_a_failing_part_is_disabled_and_reported_once() -> None:
    parts, reports = make_parts()
    part = parts["loader"]
    part.fail(ValueError("bad batch"))
    part.fail(ValueError("again"))
    assert part.on is False
    assert part.error == "ValueError: bad batch"
    assert reports == ["loader: bad batch"]
    assert all(parts[name].on for name in PART_NAMES if name != "loader")


def test_an_injected_fault_raises_once() -> None:
    parts, _ = make_parts(faults=("cuda",))
    with pytest.raises(InjectedFault):
        parts["cuda"].check()
    parts["cuda"].check()  # only the first use
    parts["steps"].check()


def test_parts_can_be_switched_off_by_name_or_all() -> None:
    parts, _ = make_parts(disabled=("stacks",))
    assert parts["stacks"].on is False
    assert parts["steps"].on is True
    everything, _ = make_parts(disabled=("all",))
    assert not any(everything[name].on for name in PART_NAMES)


def test_a_reporter_that_raises_still_leaves_the_part_off() -> None:
    def broken(part: Part, exc: BaseException, tb: str) -> None:
        raise OSError("channel gone")

    part = Part("heartbeat", on=True, fault=False, report=broken)
    part.fail(RuntimeError("x"))
    assert part.on is False
