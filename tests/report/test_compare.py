"""Comparing two runs: throughput ratio with a block-bootstrap interval, and a verdict
that never calls noise an improvement."""

from __future__ import annotations

import random

import pytest

from support import builders
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.record.types import HostSample, RunRecord, StepRecord
from trainmedic.report.compare import MIN_STEPS, compare_runs

T0 = 1_700_000_000.0


def make_record(steps: list[StepRecord]) -> RunRecord:
    return builders.make_record(steps)


def host_series(n: int, wait: float) -> list[HostSample]:
    return [
        HostSample(
            T0 + i + 1, 100.0, 1 << 30, 1, 50.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1 << 34, 0,
            others_cpu_pct=50.0, train_threads=1, train_cpu_cores=1 - wait,
            train_wait_cores=wait, train_wait_max_share=wait, helper_cpu_cores=0.0,
            job_threads=3, job_wait_cores=wait,
        )
        for i in range(n)
    ]  # fmt: skip


def run(
    median: float,
    *,
    n: int = 400,
    jitter: float = 0.1,
    samples: int | None = 32,
    seed: int = 1,
    drift: float = 0.0,
    wait: float = 0.0,
) -> RunRecord:
    """``n`` steps around ``median`` s (uniform ±``jitter`` of it), the second half
    slower by ``drift`` (a load episode)."""
    rng = random.Random(seed)
    steps, t = [], T0
    for i in range(n):
        d = median * (1 + rng.uniform(-jitter, jitter)) * (1 + (drift if i >= n // 2 else 0.0))
        t += d
        steps.append(StepRecord(i + 1, t, d, data_wait_s=wait * d, samples=samples, pid=7))
    return make_record(steps)


def finding(fid: str, severity: Severity = Severity.WARNING) -> Finding:
    return Finding(fid, Category.IO, severity, f"title {fid}", {}, "fix", 0.3)


def test_a_rerun_of_the_same_configuration_is_no_change() -> None:
    for seed in range(5):  # five reruns: different noise each time
        c = compare_runs(run(0.05, seed=seed), run(0.05, seed=seed + 100), [], [])
        assert c.verdict == "no_change", (seed, c.speedup, c.speedup_ci)
        assert c.speedup_ci is not None and c.speedup_ci[0] < 1.0 < c.speedup_ci[1]


def test_a_real_speedup_is_faster_with_its_interval() -> None:
    c = compare_runs(run(0.05), run(0.03, seed=2), [], [])
    assert c.verdict == "faster"
    assert c.speedup == pytest.approx(0.05 / 0.03, rel=0.03)
    assert c.speedup_ci is not None
    lo, hi = c.speedup_ci
    assert 1.03 < lo < c.speedup < hi
    assert c.metric == "samples_per_s"
    back = compare_runs(run(0.03, seed=2), run(0.05), [], [])
    assert back.verdict == "slower"


def test_a_small_difference_below_the_minimum_effect_is_no_change() -> None:
    # 1.5 % faster with almost no jitter: measurable, but reruns differ by more.
    c = compare_runs(run(0.05, jitter=0.001), run(0.04926, jitter=0.001, seed=2), [], [])
    assert c.speedup_ci is not None and c.speedup_ci[0] > 1.0
    assert c.verdict == "no_change"
    assert (
        compare_runs(
            run(0.05, jitter=0.001), run(0.04926, jitter=0.001, seed=2), [], [], min_effect=0.005
        ).verdict
        == "faster"
    )


def test_a_load_episode_within_a_run_widens_the_interval() -> None:
    # The "after" run is as fast, but half of it ran 40 % slower (another job started):
    # blocks of consecutive steps carry that, so the interval is wide and no speed-up
    # or slow-down is claimed from a slice of one run.
    steady = compare_runs(run(0.05), run(0.05, seed=3), [], [])
    drifting = compare_runs(run(0.05), run(0.05, seed=3, drift=0.4), [], [])
    assert steady.speedup_ci is not None and drifting.speedup_ci is not None
    width = lambda ci: ci[1] - ci[0]  # noqa: E731
    assert width(drifting.speedup_ci) > 3 * width(steady.speedup_ci)


def test_throughput_counts_samples_when_the_batch_changed() -> None:
    # Batch doubled, step 1.5x longer: 1.33x the samples per second.
    c = compare_runs(run(0.05, samples=32), run(0.075, samples=64, seed=2), [], [])
    assert c.speedup == pytest.approx(64 / 0.075 / (32 / 0.05), rel=0.03)
    assert c.verdict == "faster"
    steps_only = compare_runs(run(0.05, samples=None), run(0.075, samples=64, seed=2), [], [])
    assert steps_only.metric == "steps_per_s" and steps_only.verdict == "slower"
    assert any("steps/s" in n for n in steps_only.notes)


def test_findings_resolved_still_present_and_new() -> None:
    before = [finding("input.workers", Severity.ERROR), finding("host.sleep"),
              finding("run.healthy", Severity.INFO)]  # fmt: skip
    after = [finding("host.sleep"), finding("contention.cpu")]
    c = compare_runs(run(0.05), run(0.05, seed=2), before, after)
    assert [f.id for f in c.resolved] == ["input.workers"]
    assert [f.id for f in c.still_present] == ["host.sleep"]
    assert [f.id for f in c.new] == ["contention.cpu"]
    assert c.resolved[0].severity_before == "error" and c.resolved[0].severity_after is None


def test_too_few_steps_give_no_verdict_and_say_why() -> None:
    c = compare_runs(run(0.05, n=MIN_STEPS - 1), run(0.01, seed=2), [], [])
    assert c.verdict == "no_change" and c.speedup_ci is None
    assert any("too few steady steps" in n for n in c.notes)


def test_json_form_carries_speedup_interval_and_verdict() -> None:
    d = compare_runs(run(0.05), run(0.025, seed=2), [], []).to_dict()
    assert d["verdict"] == "faster"
    assert isinstance(d["speedup"], float) and d["speedup"] == pytest.approx(2.0, rel=0.05)
    lo, hi = d["speedup_ci"]
    assert lo < d["speedup"] < hi
    names = [m["name"] for m in d["measures"]]
    assert names[:2] == ["throughput", "step time, median"]
    assert {"resolved", "still_present", "new"} == set(d["findings"])


def test_a_changed_machine_is_noted() -> None:
    def loaded(wait: float, seed: int) -> RunRecord:
        r = run(0.05, seed=seed)
        r.host = host_series(40, wait)
        return r

    c = compare_runs(loaded(0.02, 1), loaded(0.40, 2), [], [])
    assert any("the machine changed between the runs" in n for n in c.notes)


def test_the_interval_is_repeatable() -> None:
    a, b = run(0.05), run(0.04, seed=2)
    assert compare_runs(a, b, [], []).speedup_ci == compare_runs(a, b, [], []).speedup_ci


def test_a_rerun_sped_up_only_by_others_leaving_the_machine_is_no_change() -> None:
    # Before: others' processes took 40 % of the training thread's time (steps of 50 ms);
    # after: they were gone (30 ms). The configuration did not change.
    before = run(0.05, seed=1)
    before.host = host_series(40, 0.40)
    after = run(0.03, seed=2)
    after.host = host_series(40, 0.0)
    c = compare_runs(before, after, [], [])
    assert c.speedup == pytest.approx(5 / 3, rel=0.03)  # the throughput did rise
    assert c.adjusted_speedup == pytest.approx(1.0, abs=0.03)
    assert c.verdict == "no_change"
    assert any("without the training thread's waits" in n for n in c.notes)
    d = c.to_dict()
    assert d["speedup_load_adjusted_ci"][0] < 1.0 < d["speedup_load_adjusted_ci"][1]
    # The same waits in both runs change nothing: a real fix stays faster.
    before.host, after.host = host_series(40, 0.4), host_series(40, 0.4)
    fixed = compare_runs(before, after, [], [])
    assert fixed.adjusted_speedup is None and fixed.verdict == "faster"
