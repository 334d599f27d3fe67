"""Every finding's parts agree before it is emitted (trainmedic.diagnose.consistency)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from support.builders import (
    make_activity,
    make_handoff,
    make_host_series,
    make_loader,
    make_record,
    make_steps,
)
from trainmedic.diagnose import RULES, diagnose_run
from trainmedic.diagnose.consistency import (
    CHECKS,
    PROBLEMS_KEY,
    Context,
    InconsistentFinding,
    problems,
)
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category, Finding, Severity

from .canonical import CANONICAL

TH = Thresholds()
NO_LOADER = Context(has_loader=False, usable_cores=2.0, th=TH)
LOADER = Context(has_loader=True, usable_cores=2.0, th=TH)


def finding(
    id: str = "input.network",
    category: Category = Category.NETWORK,
    severity: Severity = Severity.ERROR,
    impact: float | None = 0.94,
    fix: str = "Keep 30 samples in flight: ThreadPoolExecutor(max_workers=30).",
    apply: dict[str, Any] | None = None,
    **evidence: Any,
) -> Finding:
    return Finding(id, category, severity, "t", evidence=evidence, fix=fix, impact=impact,
                   apply=apply)  # fmt: skip


@pytest.mark.parametrize(
    ("f", "ctx", "problem"),
    [
        # the contradiction: a 94 % wait "fixed" for 1.1x, no limit named
        (finding(predicted_speedup=1.1), NO_LOADER, "without naming what limits it"),
        (finding(predicted_speedup=1.1, speedup_limited_by="compute"), NO_LOADER,
         "without naming what limits it"),
        # more than removing all of it can give
        (finding(impact=0.5, predicted_speedup=4.0), NO_LOADER, "more than removing"),
        # DataLoader settings for a loop without one
        (finding(fix="DataLoader(num_workers=2, prefetch_factor=4)"), NO_LOADER,
         "DataLoader settings"),
        (finding(apply={"dataloader": {"num_workers": 2}}), NO_LOADER, "applies DataLoader"),
        # latency-bound loading bounded by the cores, or short of what it needs
        (finding(latency_bound=True, samples_in_flight_needed=30, recommended_threads=2),
         NO_LOADER, "advises 2.0 in flight where 30 are needed"),
        (finding(latency_bound=True, samples_in_flight_needed=30, recommended_threads=30,
                 fix="ThreadPoolExecutor(30); 2 workers fit the 2 usable cores"), NO_LOADER,
         "usable cores"),
        (finding(latency_bound=True, samples_in_flight_needed=30, recommended_threads=30,
                 fix="use 30 workers"), NO_LOADER, "how so many are kept in flight"),
        # the category the dominant samples name
        (finding(category=Category.FRAMEWORK_CONFIG, loader_socket_wait_share=0.9,
                 loader_socket_wait_share_interval=[0.8, 0.95], loader_stack_samples=80),
         LOADER, "dominates"),
        (finding(category=Category.CPU, helper_resource="network",
                 helper_resource_share=1.0, helper_resource_share_interval=[0.9, 1.0],
                 helper_observations=300), NO_LOADER, "wait on network"),
        # shares from a handful of samples, or without their interval
        (finding(loader_file_read_share=1.0, loader_file_read_share_interval=[0.2, 1.0],
                 loader_stack_samples=1), LOADER, "fewer than the minimum"),
        (finding(outside_python_share=0.6, outside_stack_samples=200), NO_LOADER,
         "without its interval"),
        # not knowing is information
        (finding(settled=False), NO_LOADER, "unsettled"),
    ],
)  # fmt: skip
def test_each_contradiction_is_named(f: Finding, ctx: Context, problem: str) -> None:
    found = problems(f, ctx)
    assert found and problem in " ".join(found), found


@pytest.mark.parametrize(
    ("f", "ctx"),
    [
        (finding(), NO_LOADER),
        (finding(predicted_speedup=15.0), NO_LOADER),
        (finding(predicted_speedup=1.1, speedup_limited_by="cores"), NO_LOADER),
        (finding(fix="move the batch building into a Dataset and iterate DataLoader("
                     "dataset, num_workers=2)"), NO_LOADER),  # building one is a fix
        (finding(fix="DataLoader(num_workers=2)", apply={"dataloader": {}}), LOADER),
        (finding(latency_bound=True, samples_in_flight_needed=30,
                 recommended_num_workers=2, recommended_threads_per_worker=15), LOADER),
        # a CPU taken by others is not fixed by more in flight: not checked there
        (finding(category=Category.CONTENTION, latency_bound=True, fix="dedicated cores"),
         LOADER),
        (finding(settled=False, severity=Severity.INFO), NO_LOADER),
        (finding(outside_step_share=0.6), NO_LOADER),  # timed, not sampled
        (finding(loader_cpu_wait_share=0.3), LOADER),  # measured, not sampled
    ],
)  # fmt: skip
def test_findings_whose_parts_agree_pass(f: Finding, ctx: Context) -> None:
    assert problems(f, ctx) == []


def _contradicting_rule(view: RunView, th: Thresholds) -> Sequence[Finding]:
    return [finding(predicted_speedup=1.1, fix="DataLoader(num_workers=2)")]


def test_no_rule_can_skip_the_checks() -> None:
    record = make_record(make_steps(100, 0.1, 0.0))
    rules = (*RULES, _contradicting_rule)
    # strictly (the tests): it raises, naming the finding and what disagrees
    with pytest.raises(InconsistentFinding, match=r"input\.network") as raised:
        diagnose_run(record, rules=rules, strict=True)
    assert len(raised.value.problems) == 2
    # otherwise it is kept as information, its problems in the evidence
    (f,) = [f for f in diagnose_run(record, rules=rules) if f.id == "input.network"]
    assert f.severity is Severity.INFO and len(f.evidence[PROBLEMS_KEY]) == 2


def test_every_check_is_applied() -> None:
    assert len(CHECKS) == len(set(CHECKS)) == 6


@pytest.mark.parametrize("name", sorted(CANONICAL))
def test_the_canonical_records_are_consistent(name: str) -> None:
    diagnose_run(CANONICAL[name](), strict=True)


def test_random_records_are_consistent() -> None:
    rng = random.Random(22)
    for _ in range(150):
        n = rng.randint(5, 200)
        step = rng.choice([0.0003, 0.01, 0.1, 0.5])
        wait = step * rng.choice([0.0, 0.1, 0.3, 0.6, 0.95])
        activity = []
        if rng.random() < 0.5:
            activity.append(make_activity(**{
                s: rng.choice([0, 1, 5, 30, 200])
                for s in ("transform", "file_read", "socket_wait", "ipc_wait", "python", "idle")
            }))  # fmt: skip
        if rng.random() < 0.5:
            waits = rng.choice([3, 25, 90])
            activity.append(make_handoff(waits=waits, threads={
                s: rng.choice([0, 2, waits, 4 * waits])
                for s in ("socket", "file", "python", "cpu", "idle", "poll")
            }, processes={"cpu": rng.choice([0, waits])}))  # fmt: skip
        record = make_record(
            make_steps(n, step, wait, samples=rng.choice([None, 8, 64])),
            host=make_host_series(rng.randint(0, 30), usable_cores=rng.choice([2.0, 16.0]),
                                  job_cpu_pct=rng.choice([30.0, 190.0])),
            loaders=[make_loader(rng.choice([0, 2]))] if rng.random() < 0.4 else [],
            activity=activity,
        )  # fmt: skip
        diagnose_run(record, strict=True)
