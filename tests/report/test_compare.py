"""Comparing runs: throughput ratio with a bootstrap interval (blocks of steps, and runs
when there are several a side) never narrower than run-to-run noise allows, and a
verdict that never calls noise, a busier machine or too little evidence a change."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from support import builders
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.record.types import HostSample, RunRecord, StepRecord
from trainmedic.report.compare import MIN_STEPS, RUN_NOISE, compare_groups, compare_runs

T0 = 1_700_000_000.0


def make_record(steps: list[StepRecord]) -> RunRecord:
    return builders.make_record(steps)


def host_series(n: int, wait: float, others_pct: float = 50.0) -> list[HostSample]:
    return [
        HostSample(
            T0 + i + 1, 100.0, 1 << 30, 1, 50.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1 << 34, 0,
            others_cpu_pct=others_pct, train_threads=1, train_cpu_cores=1 - wait,
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


def test_a_rerun_of_the_same_configuration_is_never_faster_or_slower() -> None:
    for seed in range(5):  # five reruns: different noise each time
        c = compare_runs(run(0.05, seed=seed), run(0.05, seed=seed + 100), [], [])
        # One pair cannot rule out a change of 3 % against run-to-run noise of 4 %.
        assert c.verdict == "inconclusive", (seed, c.speedup, c.speedup_ci)
        assert c.speedup_ci is not None and c.speedup_ci[0] < 1.0 < c.speedup_ci[1]
        assert "runs a side" in c.reasons[0] and "would decide it" in c.reasons[0]
        # Without that noise (the steps alone), the same pair is no change.
        alone = compare_runs(run(0.05, seed=seed), run(0.05, seed=seed + 100), [], [],
                             run_noise=0.0)  # fmt: skip
        assert alone.verdict == "no_change" and alone.reasons == ()


def test_one_pair_is_never_surer_than_run_to_run_noise_and_more_runs_narrow_it() -> None:
    pair = compare_runs(run(0.05, jitter=0.001), run(0.05, jitter=0.001, seed=2), [], [])
    assert pair.speedup_ci is not None and pair.speedup is not None
    z = 1.959964
    half = z * RUN_NOISE * math.sqrt(2)
    assert math.log(pair.speedup_ci[1] / pair.speedup) == pytest.approx(half, rel=1e-3)
    four = compare_groups([run(0.05, jitter=0.001, seed=i) for i in range(4)],
                          [run(0.05, jitter=0.001, seed=10 + i) for i in range(4)],
                          [[]] * 4, [[]] * 4)  # fmt: skip
    assert four.speedup_ci is not None and four.speedup is not None
    assert math.log(four.speedup_ci[1] / four.speedup) == pytest.approx(half / 2, rel=1e-3)
    assert four.verdict == "inconclusive" and len(four.to_dict()["runs"]["before"]) == 4
    # Still wider than the 3 % band: the runs it would take are said (the interval
    # narrows as 1/sqrt(runs): (half / log 1.03)^2 runs a side).
    want = (half / math.log(1.03)) ** 2
    for c in (pair, four):
        runs = int(c.reasons[0].split("about ")[1].split()[0])
        assert 0.8 * want <= runs <= 1.25 * want, (want, c.reasons)


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
    c = compare_runs(run(0.05, jitter=0.001), run(0.04926, jitter=0.001, seed=2), [], [],
                     run_noise=0.0)  # fmt: skip
    assert c.speedup_ci is not None and c.speedup_ci[0] > 1.0
    assert c.verdict == "no_change"
    assert (
        compare_runs(
            run(0.05, jitter=0.001), run(0.04926, jitter=0.001, seed=2), [], [], min_effect=0.005,
            run_noise=0.0,
        ).verdict
        == "faster"
    )


def test_a_load_episode_within_a_run_widens_the_interval() -> None:
    # The "after" run is as fast, but half of it ran 40 % slower (another job started):
    # blocks of consecutive steps carry that, so the interval is wide and no speed-up
    # or slow-down is claimed from a slice of one run.
    steady = compare_runs(run(0.05), run(0.05, seed=3), [], [], run_noise=0.0)
    drifting = compare_runs(run(0.05), run(0.05, seed=3, drift=0.4), [], [], run_noise=0.0)
    assert steady.speedup_ci is not None and drifting.speedup_ci is not None
    width = lambda ci: ci[1] - ci[0]  # noqa: E731
    assert width(drifting.speedup_ci) > 3 * width(steady.speedup_ci)
    # The run's second half ran 1/1.4 the rate of its first: it was no one figure.
    assert drifting.verdict == "inconclusive"
    assert any("was still slowing down" in r and "0.72x" in r for r in drifting.reasons)


def test_throughput_counts_samples_when_the_batch_changed() -> None:
    # Batch doubled, step 1.5x longer: 1.33x the samples per second.
    c = compare_runs(run(0.05, samples=32), run(0.075, samples=64, seed=2), [], [],
                     run_noise=0.0)  # fmt: skip
    assert c.speedup == pytest.approx(64 / 0.075 / (32 / 0.05), rel=0.03)
    assert c.verdict == "faster"
    steps_only = compare_runs(run(0.05, samples=None), run(0.075, samples=64, seed=2), [], [],
                              run_noise=0.0)  # fmt: skip
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


def test_too_few_steps_are_inconclusive_and_say_how_many_are_needed() -> None:
    c = compare_runs(run(0.05, n=MIN_STEPS - 1), run(0.01, seed=2), [], [])
    assert c.verdict == "inconclusive" and c.speedup_ci is None
    (reason,) = c.reasons
    assert reason.startswith("too little evidence") and f"at least {MIN_STEPS}" in reason
    assert c.to_dict()["reasons"] == [reason]


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
    c = compare_runs(before, after, [], [], run_noise=0.0)
    assert c.speedup == pytest.approx(5 / 3, rel=0.03)  # the throughput did rise
    assert c.adjusted_speedup == pytest.approx(1.0, abs=0.03)
    # The rise is the others' leaving: inconclusive, saying so, never faster.
    assert c.verdict == "inconclusive"
    assert any("waited for a CPU 40% of its time" in r and "enough to explain" in r
               for r in c.reasons), c.reasons  # fmt: skip
    assert any("without the training thread's waits" in n for n in c.notes)
    d = c.to_dict()
    assert d["speedup_load_adjusted_ci"][0] < 1.0 < d["speedup_load_adjusted_ci"][1]
    # The same waits in both runs change nothing: a real fix stays faster.
    before.host, after.host = host_series(40, 0.4), host_series(40, 0.4)
    fixed = compare_runs(before, after, [], [])
    assert fixed.adjusted_speedup is None and fixed.verdict == "faster"


def test_a_run_slowed_by_others_cpu_is_inconclusive_with_the_cores_they_used() -> None:
    # 1.8x slower "after", while other processes used 0.9 cores of 2 (0.05 before); the
    # training thread's wait is not attributed to them (their load is below what moves
    # the adjusted figure), so only the confounder can say it.
    before, after = run(0.05, seed=1), run(0.09, seed=2)
    before.host = host_series(40, 0.0, others_pct=5.0)
    after.host = host_series(40, 0.0, others_pct=90.0)
    c = compare_runs(before, after, [], [])
    assert c.speedup is not None and c.speedup < 0.6
    assert c.verdict == "inconclusive"
    assert any("other processes used 0.90 cores during the slower side" in r for r in c.reasons)
    # The same load on both sides explains nothing: the slow-down stands.
    after.host = host_series(40, 0.0, others_pct=5.0)
    assert compare_runs(before, after, [], []).verdict == "slower"


def test_a_small_confounder_does_not_explain_a_large_change() -> None:
    # num_workers 0 -> 2 made it twice as fast; others used 0.3 cores more before.
    before, after = run(0.05, seed=1), run(0.025, seed=2)
    before.host = host_series(40, 0.0, others_pct=35.0)
    after.host = host_series(40, 0.0, others_pct=5.0)
    c = compare_runs(before, after, [], [])
    assert c.verdict == "faster" and c.reasons == ()


def test_another_host_is_a_confounder_and_a_changed_command_is_listed() -> None:
    before, after = run(0.05, seed=1), run(0.03, seed=2)
    before.meta = dataclasses.replace(before.meta, environment={"host": {"hostname": "a"}})
    after.meta = dataclasses.replace(after.meta, environment={"host": {"hostname": "b"}},
                                     command=("python", "train.py", "--workers", "2"))  # fmt: skip
    c = compare_runs(before, after, [], [])
    assert c.verdict == "inconclusive"
    assert any("different hosts (a before, b after)" in r for r in c.reasons)
    assert any(n.startswith("the command changed") for n in c.notes)


def test_repeated_runs_fold_the_run_to_run_spread_into_the_interval() -> None:
    # Three runs a side whose rates differ by +-10 % from run to run, no change between
    # the sides: the two-level interval spans that spread.
    spread = [0.045, 0.05, 0.055]
    same = compare_groups([run(m, jitter=0.01, seed=i) for i, m in enumerate(spread)],
                          [run(m, jitter=0.01, seed=9 + i) for i, m in enumerate(spread[::-1])],
                          [[]] * 3, [[]] * 3, run_noise=0.0)  # fmt: skip
    assert same.speedup_ci is not None and same.speedup_ci[0] < 0.95 < 1.05 < same.speedup_ci[1]
    assert same.verdict == "inconclusive"
    faster = compare_groups([run(m, seed=i) for i, m in enumerate(spread)],
                            [run(m / 2, seed=9 + i) for i, m in enumerate(spread)],
                            [[]] * 3, [[]] * 3)  # fmt: skip
    assert faster.verdict == "faster" and faster.before.name.endswith("+2")


def test_a_drift_too_small_to_explain_a_large_change_leaves_it_standing() -> None:
    # Twice as fast, while the after run's second half ran 1/1.2 the rate of its first:
    # a drift of 1.2x cannot explain 2x.
    c = compare_runs(run(0.05), run(0.025, seed=2, drift=0.2), [], [])
    assert c.verdict == "faster" and c.reasons == ()
    # Against a change of 1.1x, the same drift holds the verdict open.
    d = compare_runs(run(0.05), run(0.045, seed=2, drift=0.2), [], [], run_noise=0.0)
    assert d.verdict == "inconclusive" and "still slowing down" in d.reasons[0]


def test_one_drifting_run_of_three_moves_its_side_by_its_share_of_the_mean() -> None:
    # 1.5x faster, three runs a side; one "after" run's second half ran 1/1.37 the rate
    # of its first. Alone that run could be off by 1.37x; as a third of its side's mean
    # it moves the side by about 1.12x, which cannot explain the 1.4x measured.
    befores = [run(0.05, jitter=0.02, seed=i) for i in range(3)]
    drifting = run(0.05 / 1.5, jitter=0.02, seed=11, drift=0.37)
    afters = [run(0.05 / 1.5, jitter=0.02, seed=10), drifting,
              run(0.05 / 1.5, jitter=0.02, seed=12)]  # fmt: skip
    c = compare_groups(befores, afters, [[]] * 3, [[]] * 3, run_noise=0.0)
    assert c.verdict == "faster" and c.reasons == (), (c.speedup_ci, c.reasons)
    # The same drift in a single pair can explain the change: held open, and said.
    pair = compare_runs(befores[0], drifting, [], [], run_noise=0.0)
    assert pair.speedup_ci is not None and pair.speedup_ci[0] > 1.03
    assert pair.verdict == "inconclusive" and "still slowing down" in pair.reasons[0]


def test_another_version_of_the_script_is_listed_not_held_against_the_verdict() -> None:
    before, after = run(0.05, seed=1), run(0.025, seed=2)
    before.meta = dataclasses.replace(before.meta, environment={"script": {
        "path": "/w/train.py", "sha256": "a" * 64, "git_commit": "1234567890ab",
        "git_modified": False}})  # fmt: skip
    after.meta = dataclasses.replace(after.meta, environment={"script": {
        "path": "/w/train.py", "sha256": "b" * 64, "git_commit": "1234567890ab",
        "git_modified": True}})  # fmt: skip
    c = compare_runs(before, after, [], [])
    assert c.verdict == "faster"
    assert ("the script changed: train.py at 1234567890 -> train.py at 1234567890+modified "
            "(sha256 bbbbbbbbbbbb)") in c.notes  # fmt: skip


def test_a_run_that_crashed_is_said_so_beside_its_verdict() -> None:
    crashed = run(0.025, seed=2)
    crashed.meta = dataclasses.replace(crashed.meta, exit_code=-11)
    c = compare_runs(run(0.05), crashed, [], [])
    assert c.verdict == "faster"
    assert any("ended with exit code -11 (killed by SIGSEGV): its steps until then" in n
               for n in c.notes), c.notes  # fmt: skip
    assert not any("exit code" in n for n in compare_runs(run(0.05), run(0.025), [], []).notes)
