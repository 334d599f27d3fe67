"""One job's ranks compared from their torch.profiler traces: who the others wait for.

In data-parallel training every rank waits at each all-reduce for the slowest
one, so a rank whose GPU has more to compute, or whose host takes longer to
bring the next batch, costs all the others the difference every step. From one
trace per rank (``trainmedic report r0.json.gz r1.json.gz ...``), per rank and
as medians over its steps:

* its GPU compute: busy time less the NCCL time nothing else overlapped (what
  the others would wait for at the all-reduce);
* its wait for data: the ``enumerate(DataLoader)`` spans.

The rank furthest above the others' median in either is named, with the
others' wait (its excess) as the share of its step: ``distributed.gpu_imbalance``
(``gpu_capacity``: uneven work, or a slower GPU) or
``distributed.straggler.data``. Limits are the live rank rules'
(:class:`~trainmedic.diagnose.ranks.thresholds.RankThresholds`).

A rank that waits for the straggler sees that wait as NCCL time nothing
overlaps: :func:`attribute_waits` says so on its ``gpu.exposed_communication``,
which then is information, not a call for bucket sizes.

Traces are compared only as one job's ranks: distinct ranks of the same world
size; anything else is judged trace by trace.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from typing import Any

from trainmedic.diagnose.ranks.thresholds import DEFAULT_RANK_THRESHOLDS, RankThresholds
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.traces.kineto import TraceStep, TraceSummary


def one_job(traces: Sequence[TraceSummary]) -> bool:
    """Whether the traces are one job's ranks: two or more, each with steps and a rank,
    the ranks distinct, one world size."""
    if len(traces) < 2 or any(t.rank is None or not t.steps for t in traces):
        return False
    ranks = [t.rank for t in traces]
    return len(set(ranks)) == len(ranks) and len({t.world_size for t in traces}) == 1


def _median(t: TraceSummary, value: Callable[[TraceStep], float]) -> float:
    return statistics.median(value(s) for s in t.steps)


def per_rank(traces: Sequence[TraceSummary]) -> list[dict[str, Any]]:
    """Each rank's medians, milliseconds: step, GPU compute, exposed NCCL, data wait."""
    return [
        {
            "rank": t.rank,
            "step_ms": round(_median(t, lambda s: s.dur_us) / 1000, 3),
            "gpu_compute_ms": round(_median(t, _compute_us) / 1000, 3),
            "exposed_nccl_ms": round(_median(t, lambda s: s.exposed_nccl_us) / 1000, 3),
            "data_wait_ms": round(_median(t, lambda s: s.data_us) / 1000, 3),
        }
        for t in sorted(traces, key=lambda t: t.rank or 0)
    ]


def _compute_us(s: TraceStep) -> float:
    return max(0.0, s.gpu_busy_us - s.exposed_nccl_us)


def _severity(share: float, rt: RankThresholds) -> Severity:
    if share >= rt.holdback_error_share:
        return Severity.ERROR
    if share >= rt.holdback_warning_share:
        return Severity.WARNING
    return Severity.INFO


def compare_ranks(
    traces: Sequence[TraceSummary], rt: RankThresholds = DEFAULT_RANK_THRESHOLDS
) -> list[Finding]:
    """The rank the others wait for, if any (nothing unless :func:`one_job`)."""
    if not one_job(traces):
        return []
    table = per_rank(traces)
    out: list[Finding] = []
    for key, (fid, category, title, fix) in _STRAGGLERS.items():
        slow = max(table, key=lambda r: r[key])
        reference = statistics.median(r[key] for r in table if r is not slow)
        excess_ms = slow[key] - reference
        share = excess_ms / slow["step_ms"] if slow["step_ms"] > 0 else 0.0
        if excess_ms / 1000 < rt.holdback_min_s or share < rt.holdback_info_share:
            continue
        ev = {"rank": slow["rank"], f"rank_{key}": slow[key], f"others_{key}": reference,
              "others_wait_ms_per_step": round(excess_ms, 3), "others_wait_share": round(share, 4),
              "ranks_compared": len(table), "world_size": traces[0].world_size,
              "per_rank": table}  # fmt: skip
        words = {"rank": slow["rank"], "mine": slow[key], "others": reference,
                 "excess": excess_ms, "share": share}  # fmt: skip
        out.append(Finding(
            id=fid, category=category, severity=_severity(share, rt),
            title=title.format(**words), evidence=ev, fix=fix.format(**words),
            impact=share, subject=f"rank{slow['rank']}",
        ))  # fmt: skip
    return out


_STRAGGLERS: dict[str, tuple[str, Category, str, str]] = {
    "gpu_compute_ms": (
        "distributed.gpu_imbalance", Category.GPU_CAPACITY,
        "Rank {rank}'s GPU computes {mine:.1f} ms a step, the others' {others:.1f} ms: every "
        "other rank waits {excess:.1f} ms a step for it at the all-reduce ({share:.0%} of the "
        "step)",
        "Give rank {rank} the same work as the others: equal batch sizes and sequence lengths "
        "per rank (DistributedSampler with drop_last=True, length-grouped batches), equal "
        "model shards, no extra work on one rank inside the loop; if the work is equal, its "
        "GPU is slower - check its clocks and temperature (trainmedic doctor on that node).",
    ),
    "data_wait_ms": (
        "distributed.straggler.data", Category.FRAMEWORK_CONFIG,
        "Rank {rank} is a straggler: it waits {mine:.1f} ms a step for its next batch, the "
        "others {others:.1f} ms; they wait {excess:.1f} ms a step for it ({share:.0%} of the "
        "step)",
        "Make rank {rank}'s loading as fast as the others': the same DataLoader settings "
        "(num_workers, pin_memory, prefetch_factor) and data as near (local SSD, not a remote "
        "share); run the job under 'trainmedic run' to measure which resource its loader "
        "waits on. Every rank runs at the slowest one's pace.",
    ),
}  # fmt: skip
"""Per measure compared: the finding's id, category, title and fix (``str.format`` with
the rank, its value, the others' median, the excess and its share of the step)."""


def attribute_waits(
    findings: list[Finding], trace: TraceSummary, compared: Sequence[Finding]
) -> list[Finding]:
    """``trace``'s findings, its exposed communication said to be the wait for the
    straggler of ``compared`` where that wait is most of it."""
    out = []
    for f in findings:
        straggler = next((c for c in compared if c.subject != f"rank{trace.rank}"), None)
        exposed = f.evidence.get("exposed_nccl_ms_per_step")
        if f.id != "gpu.exposed_communication" or straggler is None or exposed is None:
            out.append(f)
            continue
        wait = float(straggler.evidence["others_wait_ms_per_step"])
        if wait < 0.5 * float(exposed):
            out.append(f)
            continue
        who = straggler.evidence["rank"]
        out.append(dataclasses.replace(
            f, severity=Severity.INFO, impact=None,
            title=(f"{f.title}; {min(wait, float(exposed)):.1f} ms of its "
                   f"{float(exposed):.1f} ms a step is the wait for rank {who} "
                   f"({straggler.id})"),
            evidence={**f.evidence, "wait_for_rank": who, "wait_for_rank_ms_per_step": wait},
            fix=f"See {straggler.id}: rank {who} is the one to fix; the all-reduce waits for it.",
        ))  # fmt: skip
    return out
