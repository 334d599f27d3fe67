"""Shares from stack samples carry their uncertainty (trainmedic.diagnose.sampled)."""

from __future__ import annotations

import pytest

from trainmedic.diagnose.sampled import (
    dominant_of,
    dominant_state,
    sampled,
    share_evidence,
    wilson_interval,
)
from trainmedic.diagnose.thresholds import Thresholds

TH = Thresholds()


def test_the_wilson_interval_is_honest_at_the_edges_and_narrows_with_samples() -> None:
    # 12 of 20: 60 %, and 41-76 % (90 %) would have said the same
    low, high = wilson_interval(12, 20, 1.645)
    assert low == pytest.approx(0.4185, abs=1e-3) and high == pytest.approx(0.7578, abs=1e-3)
    # one of one is not certainty; none of 300 is not nothing for sure
    assert wilson_interval(1, 1, 1.645)[0] < 0.3
    assert 0.0 < wilson_interval(0, 300, 1.645)[1] < 0.01
    assert wilson_interval(0, 0, 1.645) == (0.0, 1.0)
    widths = [wilson_interval(n // 2, n, 1.645) for n in (20, 80, 320)]
    assert [h - lo for lo, h in widths] == sorted([h - lo for lo, h in widths], reverse=True)


def test_a_verdict_is_settled_only_when_the_interval_is_past_the_bar() -> None:
    assert sampled(19, 20, TH).versus(0.4) is True
    assert sampled(2, 20, TH).versus(0.4) is False
    assert sampled(9, 20, TH).versus(0.4) is None  # 45 %: 28-63 %, across the bar
    assert sampled(9, 10, TH).versus(0.4) is None  # too few samples to decide anything
    # a part of step time: 60 % of the samples of a 50 % share
    assert sampled(60, 100, TH).versus(0.2, scale=0.5) is True


def test_no_share_is_reported_from_fewer_samples_than_the_minimum() -> None:
    few = share_evidence("loader_", {"file_read": 3, "transform": 1},
                         ("file_read", "transform"), TH, "loader_stack_samples")  # fmt: skip
    assert few == {"loader_stack_samples": 4, "loader_stack_samples_needed": 20}
    enough = share_evidence("loader_", {"file_read": 30, "transform": 10},
                            ("file_read", "transform"), TH, "loader_stack_samples")  # fmt: skip
    assert enough["loader_file_read_share"] == 0.75
    low, high = enough["loader_file_read_share_interval"]
    assert low < 0.75 < high


def test_a_category_is_never_chosen_from_a_handful_or_a_tie() -> None:
    states = ("file_read", "socket_wait", "transform")
    assert dominant_state({"file_read": 5}, states, TH) is None  # a handful
    assert dominant_state({"file_read": 50, "transform": 5}, states, TH) == "file_read"
    # two states past 40 % each: neither is "the" cause
    assert dominant_state({"file_read": 45, "socket_wait": 45, "transform": 10}, states, TH) is None
    assert dominant_of({"a": (0.5, 0.45, 0.55), "b": (0.3, 0.2, 0.4)}, 0.4) == "a"
    assert dominant_of({}, 0.4) is None
