"""Several nodes' records merged into one: clocks aligned on lockstep steps, identities apart."""

from __future__ import annotations

import dataclasses
import random

import pytest
from tests.diagnose.test_ranks import PID0, ddp_record

from trainmedic.diagnose import diagnose_run
from trainmedic.record.merge import GPU_STRIDE, PID_STRIDE, align_clocks, merge_records, why_apart
from trainmedic.record.types import RunRecord


def split_node(record: RunRecord, ranks: set[int], skew: float, host: str) -> RunRecord:
    """The part of a lockstep record one node saw, on a clock ``skew`` seconds ahead."""
    pids = {PID0 + r for r in ranks}
    steps = [dataclasses.replace(s, t=s.t + skew) for s in record.steps if s.pid in pids]
    events = [
        dataclasses.replace(e, t=e.t + skew, data={**e.data, "node": host})
        for e in record.events
        if e.pid in pids
    ]
    meta = dataclasses.replace(record.meta, started_at=record.meta.started_at + skew,
                               ended_at=(record.meta.ended_at or 0) + skew)  # fmt: skip
    loaders = [lo for lo in record.loaders if lo.pid in pids]
    activity = [a for a in record.loader_activity if a.pid in pids]
    return RunRecord(meta, steps, [], loaders, activity, [], [], events)


def test_a_skewed_clock_is_measured_and_removed() -> None:
    whole = ddp_record(ranks=4, wait=lambda r, k, rng: 0.02 * (r == 3) + rng.uniform(0, 0.001),
                       activity={3: {"file_read": 80}})  # fmt: skip
    a = split_node(whole, {0, 1}, 0.0, "alpha")
    b = split_node(whole, {2, 3}, 2.5, "beta")
    align = align_clocks(a, b)
    assert align.method == "lockstep steps"
    assert align.offset_s == pytest.approx(2.5, abs=0.001)
    assert align.accuracy_s is not None and align.accuracy_s < 0.001
    merged = merge_records([("b-dir", b), ("a-dir", a)])  # the lowest rank's node leads
    nodes = merged.meta.environment["nodes"]
    assert [n["hostname"] for n in nodes] == ["alpha", "beta"]
    assert nodes[1]["clock_offset_s"] == pytest.approx(2.5, abs=0.001)
    assert {s.pid for s in merged.steps} == {PID0, PID0 + 1, PID0 + 2 + PID_STRIDE,
                                             PID0 + 3 + PID_STRIDE}  # fmt: skip
    findings = {f.id: f for f in diagnose_run(merged)}
    f = findings["distributed.straggler.data"]
    assert f.evidence["rank"] == 3 and f.evidence["node"] == "beta"
    assert "on beta" in f.title


def test_without_common_steps_wall_clocks_are_kept() -> None:
    whole = ddp_record(ranks=2, n=3)
    a = split_node(whole, {0}, 0.0, "alpha")
    b = split_node(whole, {1}, 0.7, "beta")
    align = align_clocks(a, b)
    assert align.method == "wall clocks" and align.offset_s == 0.0 and align.accuracy_s is None


def test_same_host_names_are_told_apart_and_gpus_renumbered() -> None:
    from support.builders import make_gpu

    whole = ddp_record(ranks=2)
    a = split_node(whole, {0}, 0.0, "vm")
    b = split_node(whole, {1}, 0.0, "vm")
    b.gpu.append(make_gpu(b.meta.started_at + 1, index=0, job_pids=(PID0 + 1,)))
    merged = merge_records([("a", a), ("b", b)])
    assert [n["hostname"] for n in merged.meta.environment["nodes"]] == ["vm/0", "vm/1"]
    assert merged.gpu[0].index == GPU_STRIDE
    assert merged.gpu[0].processes[0].pid == PID0 + 1 + PID_STRIDE


def test_random_offsets_come_back(seed: int = 7) -> None:
    rng = random.Random(seed)
    whole = ddp_record(ranks=2, n=40)
    for _ in range(5):
        skew = rng.uniform(-30, 30)
        align = align_clocks(split_node(whole, {0}, 0, "a"), split_node(whole, {1}, skew, "b"))
        assert align.offset_s == pytest.approx(skew, abs=0.001)


def test_only_runs_that_can_be_one_jobs_nodes_are_merged() -> None:
    whole = ddp_record(ranks=4)
    a = split_node(whole, {0, 1}, 0.0, "alpha")
    b = split_node(whole, {2, 3}, 2.5, "beta")
    assert why_apart([("a", a), ("b", b)]) is None
    # The same node's run given twice (or 50 copies of one run): the same ranks twice.
    said = why_apart([("a", a), ("copy", a), ("b", b)])
    assert said is not None and said.startswith("a and copy both hold rank 0")
    # A run of one process: no node of a job across nodes.
    single = dataclasses.replace(a, steps=[dataclasses.replace(s, rank=None) for s in a.steps],
                                 events=[])  # fmt: skip
    said = why_apart([("a", a), ("one", single)])
    assert said is not None and "one holds no distributed ranks" in said
    # Two halves of a job a day apart are two jobs, whatever their ranks.
    later = split_node(whole, {2, 3}, 86_400.0, "beta")
    said = why_apart([("a", a), ("later", later)])
    assert said is not None and "did not run at the same time" in said
    # Minutes of clock skew between nodes are not a day.
    assert why_apart([("a", a), ("skewed", split_node(whole, {2, 3}, 300.0, "beta"))]) is None
