"""Distributed rules: stragglers, GPU imbalance, collective timeouts (hand-built lockstep runs)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import pytest

from support.builders import (
    T0,
    make_activity,
    make_event,
    make_gpu,
    make_loader,
    make_record,
)
from trainmedic.diagnose import diagnose_run
from trainmedic.diagnose.ranks import DEFAULT_RANK_THRESHOLDS, compare_ranks
from trainmedic.gpu.types import ClockEventReason
from trainmedic.record.ranks import aligned_steps, rank_stats, rank_table
from trainmedic.record.stats import all_spans, split_steps
from trainmedic.record.types import RunRecord, StepRecord

PID0 = 5000


def ddp_record(
    ranks: int = 2,
    n: int = 80,
    *,
    own: Callable[[int, int, random.Random], float] = lambda r, k, rng: 0.020,
    wait: Callable[[int, int, random.Random], float] = lambda r, k, rng: 0.0005,
    comm: float = 0.002,
    seed: int = 0,
    loaders: bool = True,
    outside_waits: bool = False,
    activity: dict[int, dict[str, int]] | None = None,
    gpu: Sequence = (),
) -> RunRecord:
    """Ranks stepping in lockstep: each step lasts as long as the slowest rank's
    data wait plus own compute, plus the all-reduce; the others wait the rest in
    their backward (compute), as DDP on gloo does. ``outside_waits``: the others
    wait outside compute instead (an explicit all_reduce of metrics)."""
    rng = random.Random(seed)
    steps: list[StepRecord] = []
    t = T0 + 5.0
    for k in range(1, n + 1):
        w = [wait(r, k, rng) for r in range(ranks)]
        c = [own(r, k, rng) for r in range(ranks)]
        d = max(w[r] + c[r] for r in range(ranks)) + comm
        t += d
        for r in range(ranks):
            held = d - w[r] - c[r]
            if outside_waits:
                data_wait, compute = w[r] + held - comm, c[r] + comm
            else:
                data_wait, compute = w[r], c[r] + held
            steps.append(
                StepRecord(
                    step=k,
                    t=t + rng.uniform(0, 0.0003),
                    duration_s=d,
                    data_wait_s=data_wait,
                    compute_s=compute,
                    samples=16,
                    pid=PID0 + r,
                    rank=r,
                )
            )
    events = [
        make_event("process_start", pid=PID0 + r, rank=r, local_rank=r, role="process", node="vm")
        for r in range(ranks)
    ]
    acts = []
    for r, counts in (activity or {}).items():
        acts.append(make_activity(pid=PID0 + r, **counts))
    return make_record(
        steps,
        events=events,
        loaders=[make_loader(0, pid=PID0 + r) for r in range(ranks)] if loaders else [],
        activity=acts,
        gpu=gpu,
    )


def by_id(record: RunRecord) -> dict[str, dict]:
    return {f.id: f for f in diagnose_run(record)}  # type: ignore[misc]


def test_rank_table_and_stats() -> None:
    record = ddp_record(own=lambda r, k, rng: 0.020, wait=lambda r, k, rng: 0.030 * (r == 1))
    table = rank_table(record)
    assert {pid: i.rank for pid, i in table.items()} == {PID0: 0, PID0 + 1: 1}
    stats = rank_stats(record, split_steps(all_spans(record)))
    assert [s.rank for s in stats] == [0, 1]
    one = stats[1]
    assert one.data_wait_s == pytest.approx(0.030, rel=1e-6)
    # own 20 ms, 30 ms waiting for rank 1, 2 ms of the all-reduce itself
    assert stats[0].compute_s == pytest.approx(0.052, rel=1e-6)
    assert one.node == "vm" and one.local_rank == 1
    assert len(aligned_steps(record, split_steps(all_spans(record)))) >= 70


def test_slow_data_names_the_rank_and_the_others_wait() -> None:
    record = ddp_record(
        ranks=4,
        wait=lambda r, k, rng: (0.030 if r == 2 else 0.001) + rng.uniform(0, 0.002),
        activity={2: {"file_read": 90, "transform": 5}},
    )
    f = by_id(record)["distributed.straggler.data"]
    assert f.evidence["rank"] == 2
    assert f.category.value == "io"
    assert f.evidence["others_wait_in_collectives_s"] == pytest.approx(0.029, abs=0.002)
    assert f.evidence["others_wait_in_backward_s"] == pytest.approx(0.029, abs=0.003)
    assert f.severity.value == "error"  # 29 ms of a ~53 ms step
    assert "Rank 2" in f.title and "3 ranks wait" in f.title


def test_a_data_straggler_replaces_the_pooled_input_finding() -> None:
    # Rank 1 waits 60 ms a step for its data, rank 0 about none: pooled, the job
    # "waits for data" ~half the step, which names no rank and no fix for rank 0.
    record = ddp_record(
        wait=lambda r, k, rng: (0.060 if r == 1 else 0.0005) + rng.uniform(0, 0.002),
        activity={1: {"transform": 90}},
    )
    ids = set(by_id(record))
    assert "distributed.straggler.data" in ids
    assert not any(i.startswith("input.") for i in ids)


def test_every_rank_waiting_for_data_keeps_the_input_finding() -> None:
    # No straggler: all ranks wait alike, and the job-wide input finding stands.
    record = ddp_record(
        wait=lambda r, k, rng: 0.060 + rng.uniform(0, 0.002),
        activity={0: {"transform": 90}, 1: {"transform": 90}},
    )
    ids = set(by_id(record))
    assert "distributed.straggler.data" not in ids
    assert any(i.startswith("input.") for i in ids)


@pytest.mark.parametrize(
    ("state", "category"), [("socket_wait", "network"), ("transform", "cpu")]
)
def test_the_cause_follows_the_straggler_s_loader(state: str, category: str) -> None:
    record = ddp_record(
        wait=lambda r, k, rng: 0.015 * (r == 1), activity={1: {state: 80}, 0: {"idle": 80}}
    )
    f = by_id(record)["distributed.straggler.data"]
    assert f.category.value == category
    assert f.evidence["rank"] == 1


@pytest.mark.parametrize("ranks", [2, 4, 8])
@pytest.mark.parametrize("seed", range(6))
def test_noise_never_makes_a_straggler(ranks: int, seed: int) -> None:
    """Balanced ranks with heavy per-step noise (waits up to half the step, and
    occasional 10x stalls on any rank) raise no straggler finding."""

    def noisy(r: int, k: int, rng: random.Random) -> float:
        spike = 0.2 if rng.random() < 0.03 else 0.0
        return rng.uniform(0.0, 0.012) + spike

    record = ddp_record(ranks=ranks, n=120, wait=noisy, seed=seed,
                        own=lambda r, k, rng: rng.uniform(0.015, 0.025))  # fmt: skip
    assert not [i for i in by_id(record) if i.startswith("distributed.straggler")]


def test_a_small_steady_difference_is_not_a_straggler() -> None:
    """One rank 1 ms slower to load on a 25 ms step: 4 %, under the 10 % a user would act on."""
    record = ddp_record(wait=lambda r, k, rng: 0.001 * (r == 1) + rng.uniform(0, 0.0002))
    assert "distributed.straggler.data" not in by_id(record)


def test_a_wait_for_peers_outside_compute_is_not_taken_for_slow_data() -> None:
    """A job whose ranks wait in an all_reduce of metrics after the step (outside
    forward/backward, so counted as data wait without a DataLoader) must not get
    the waiting rank named: rank 1 is slower in compute, ranks 0 waits outside."""
    record = ddp_record(
        own=lambda r, k, rng: 0.040 if r == 1 else 0.010,
        loaders=False,
        outside_waits=True,
    )
    assert not [i for i in by_id(record) if i.startswith("distributed.straggler.data")]


def test_ranks_that_do_not_wait_for_each_other_have_no_straggler() -> None:
    """Independent processes (no collectives): the slow one holds nobody back."""
    steps = []
    for r, d in ((0, 0.02), (1, 0.05)):
        t = T0 + 5.0
        for k in range(1, 81):
            t += d
            steps.append(StepRecord(step=k, t=t, duration_s=d, data_wait_s=d - 0.015,
                                    compute_s=0.015, pid=PID0 + r, rank=r))  # fmt: skip
    record = make_record(steps, loaders=[make_loader(0, pid=PID0), make_loader(0, pid=PID0 + 1)])
    assert "distributed.straggler.data" not in by_id(record)


def test_compare_ranks_is_pure_and_measures_the_holdback() -> None:
    record = ddp_record(wait=lambda r, k, rng: 0.010 * (r == 0))
    held = compare_ranks(aligned_steps(record, split_steps(all_spans(record))),
                         DEFAULT_RANK_THRESHOLDS)  # fmt: skip
    assert held[0].holdback_s == pytest.approx(0.010, abs=1e-6)
    assert held[0].slowest_share == 1.0 and held[0].lockstep
    assert held[1].holdback_s == 0.0


def _gpus(clock0: float, clock1: float, reasons1: int, util: tuple[float, float] = (95, 95)):
    out = []
    for i in range(40):
        t = T0 + 5.0 + i * 0.1
        out.append(make_gpu(t, index=0, job_pids=(PID0,), sm_clock_mhz=clock0,
                            utilization_gpu_pct=util[0]))  # fmt: skip
        out.append(make_gpu(t, index=1, job_pids=(PID0 + 1,), sm_clock_mhz=clock1,
                            clock_event_reasons=reasons1, utilization_gpu_pct=util[1]))  # fmt: skip
    return out


def test_a_throttled_gpu_makes_its_rank_the_straggler() -> None:
    record = ddp_record(gpu=_gpus(1980.0, 1300.0, int(ClockEventReason.SW_THERMAL_SLOWDOWN)))
    f = by_id(record)["distributed.straggler.gpu"]
    assert f.evidence["rank"] == 1 and f.evidence["gpu"] == 1
    assert f.evidence["gpu_matched_by"] == "process list"
    assert f.category.value == "thermal"
    assert f.evidence["clock_ratio"] == pytest.approx(1300 / 1980, rel=1e-3)


def test_uneven_gpu_load_is_reported_as_gpu_capacity() -> None:
    record = ddp_record(gpu=_gpus(1980.0, 1980.0, 0, util=(95.0, 40.0)))
    f = by_id(record)["distributed.gpu_imbalance"]
    assert f.category.value == "gpu_capacity"
    assert f.evidence["busiest_gpu"] == 0 and f.evidence["idlest_rank"] == 1
    even = ddp_record(gpu=_gpus(1980.0, 1980.0, 0, util=(95.0, 88.0)))
    assert "distributed.gpu_imbalance" not in by_id(even)


def test_collective_timeout_fits_the_longest_gap() -> None:
    record = ddp_record()
    eval_steps = [
        StepRecord(step=1, t=T0 + 200.0, duration_s=150.0, phase="eval", pid=PID0 + r, rank=r)
        for r in range(2)
    ]
    record.steps.extend(eval_steps)
    f = by_id(record)["distributed.collective_timeout"]
    assert f.evidence["longest_phase_s"] == 150.0
    assert f.evidence["recommended_collective_timeout_s"] == 600.0  # 3 x 150 s, rounded up
    assert "timeout=datetime.timedelta(seconds=600)" in f.fix
    assert "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=660" in f.fix
    assert f.severity.value == "info"


def test_a_single_process_run_gets_no_distributed_finding() -> None:
    from support.builders import make_steps

    record = make_record(make_steps(80, 0.02))
    assert not [i for i in by_id(record) if i.startswith("distributed.")]


def test_without_a_dataloader_stacks_preparing_data_make_it_the_rank_s_own() -> None:
    record = ddp_record(
        wait=lambda r, k, rng: 0.015 * (r == 1),
        loaders=False,
        activity={1: {"transform": 60, "other": 10}},
    )
    f = by_id(record)["distributed.straggler.data"]
    assert f.evidence["rank"] == 1 and f.category.value == "cpu"


def test_uneven_batches_name_the_rank_with_the_most() -> None:
    record = ddp_record(ranks=3)
    record.steps = [
        s if s.rank != 2 else StepRecord(**{**s.__dict__, "samples": 24}) for s in record.steps
    ]
    f = by_id(record)["distributed.uneven_batches"]
    assert f.evidence["rank"] == 2 and f.evidence["ratio"] == 1.5
    assert "distributed.uneven_batches" not in by_id(ddp_record(ranks=3))
