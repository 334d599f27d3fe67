"""The data straggler: one rank's own data loading holds every other rank back,
named with the cause of its wait (:func:`~trainmedic.diagnose.input_causes.input_cause`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from trainmedic.diagnose.input_causes import input_cause
from trainmedic.diagnose.ranks.compare import compare_ranks
from trainmedic.diagnose.ranks.thresholds import RankThresholds
from trainmedic.diagnose.ranks.units import mean, ms, nodes, ranks_word
from trainmedic.diagnose.sampled import dominant_state, sampled, share_evidence
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import BUSY_STATES, RunView
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.record.ranks import (
    RankStats,
    aligned_steps,
    rank_table,
)
from trainmedic.record.types import RunRecord


def data_straggler(
    view: RunView, th: Thresholds, rt: RankThresholds, stats: Sequence[RankStats]
) -> Finding | None:
    """A rank whose own data wait holds the others back in lockstep (module docstring)."""
    aligned = aligned_steps(view.record, view.split)
    if len(aligned) < rt.min_aligned_steps:
        return None
    compared = compare_ranks(aligned, rt)
    best = max(compared, key=lambda h: h.excess_s)
    step = best.step_s
    if (
        step <= 0
        or not best.lockstep
        or best.slowest_share < rt.slowest_share
        or best.holdback_s < max(rt.holdback_min_s, rt.holdback_info_share * step)
    ):
        return None
    own = {s.rank: s for s in stats}[best.rank]
    pids = _pids_of_rank(view.record, best.rank)
    if not any(lo.pid in pids for lo in view.record.loaders) and not _prepares_data(
        view, th, rt, pids
    ):
        # Without a DataLoader, "data wait" is host time outside forward/backward/
        # optimizer, which may itself be a wait on the others (an all_reduce of
        # metrics, a barrier): the others' longer compute then means they compute
        # more, not that they wait. Only stacks showing the rank preparing data
        # (reading, receiving, transforming) make the difference its own.
        return None
    share = min(1.0, best.holdback_s / step)
    cause = _data_cause(view, th, pids, best.rank)
    others = [s for s in stats if s.rank != best.rank]
    severity = Severity.INFO
    if share >= rt.holdback_error_share:
        severity = Severity.ERROR
    elif share >= rt.holdback_warning_share:
        severity = Severity.WARNING
    n_others = len(others)
    ev: dict[str, Any] = {
        "rank": best.rank,
        "local_rank": own.local_rank,
        "node": own.node,
        "pids": list(own.pids),
        "straggler_data_wait_s": own.data_wait_s,
        "others_data_wait_s": mean(s.data_wait_s for s in others),
        "others_wait_in_collectives_s": best.holdback_s,
        "others_wait_share": share,
        "others_wait_measured_by": "lockstep steps: the straggler's data wait minus each "
        "other rank's, step by step (median), averaged over the others",
        "step_time_s": step,
        "lockstep_steps": best.steps,
        "slowest_in_share_of_steps": best.slowest_share,
        "cause_category": cause[0].value,
    }
    if best.backward_wait_s is not None:
        ev["others_wait_in_backward_s"] = best.backward_wait_s
    ev.update(cause[3])
    ev = {k: v for k, v in ev.items() if v is not None}
    where = f" on {own.node}" if own.node and nodes(stats) > 1 else ""
    title = (
        f"Rank {best.rank}{where} is a straggler: its data is slower ({cause[1]}); the other "
        f"{ranks_word(n_others)} {'waits' if n_others == 1 else 'wait'} "
        f"{ms(best.holdback_s)} per step for it in collectives "
        f"({share:.0%} of the {ms(step)} step)"
    )
    fix = (
        f"Make rank {best.rank}'s data as fast as the others': {cause[2]} Every rank waits "
        "for the slowest one at each all-reduce, so the whole job runs at its pace."
    )
    return Finding(
        id="distributed.straggler.data",
        category=cause[0],
        severity=severity,
        title=title,
        evidence=ev,
        fix=fix,
        impact=share,
        subject=f"rank{best.rank}",
    )


def _data_cause(
    view: RunView, th: Thresholds, pids: frozenset[int], rank: int
) -> tuple[Category, str, str, dict[str, Any]]:
    """Why the rank's data is slower: its loader's stacks first (files, sockets,
    transforms), then its node's load, then the input rule on its processes alone."""
    mine = _activity(view, pids)
    busy = sum(mine[k] for k in BUSY_STATES)
    ev: dict[str, Any] = {}
    if busy:
        ev.update(share_evidence("loader_", mine, BUSY_STATES, th, "loader_stack_samples"))
    dominant = dominant_state(mine, BUSY_STATES, th)
    if dominant == "file_read":
        return (
            Category.IO,
            "its loader spends its time reading files",
            "copy its data to local SSD or /dev/shm, or check its node's storage "
            "(trainmedic doctor on that node measures it); more DataLoader workers overlap "
            "the reads.",
            ev,
        )
    if dominant == "socket_wait":
        return (
            Category.NETWORK,
            "its loader spends its time waiting on network sockets",
            "cache its shard locally before training, or move it next to the node; "
            "prefetch more batches (prefetch_factor=4+) with more workers.",
            ev,
        )
    node = _node_load(view, rank)
    if node is not None:
        ev.update(node)
        return (
            Category.CONTENTION,
            f"its node {node['node']} is busier: other processes use "
            f"{node['node_others_cpu_cores']:.1f} cores there",
            "give its node's CPUs to the job (stop or move the other processes), or "
            "exclude the node.",
            ev,
        )
    if dominant == "transform":
        return (
            Category.CPU,
            "its samples take more CPU to prepare (its loader runs transforms)",
            "make its samples cheaper (pre-process its shard once, decode on the GPU), "
            "balance the expensive samples across ranks, or give its loader more "
            "workers.",
            ev,
        )
    sub = _sub_view(view, pids)
    cause = input_cause(sub, th)
    ev.update({k: v for k, v in cause.evidence.items() if k not in ev})
    return (cause.category, cause.title, cause.fix, ev)


def _prepares_data(view: RunView, th: Thresholds, rt: RankThresholds, pids: frozenset[int]) -> bool:
    """The rank's stacks between steps were mostly preparing data."""
    mine = _activity(view, pids)
    total = sum(mine.values())
    busy = sum(mine[k] for k in ("transform", "file_read", "socket_wait"))
    return sampled(busy, total, th).versus(rt.corroboration) is True


def _activity(view: RunView, pids: frozenset[int]) -> Counter[str]:
    total: Counter[str] = Counter()
    for a in view.record.loader_activity:
        if a.pid in pids:
            total.update({k: v for k, v in a.counts.items() if v > 0})
    return total


def _sub_view(view: RunView, pids: frozenset[int]) -> RunView:
    """The run as one rank's processes saw it (host and GPU readings kept whole)."""
    r = view.record
    record = RunRecord(
        meta=r.meta,
        steps=[s for s in r.steps if s.pid in pids],
        windows=[w for w in r.windows if w.pid in pids],
        loaders=[lo for lo in r.loaders if lo.pid in pids],
        loader_activity=[a for a in r.loader_activity if a.pid in pids],
        gpu=r.gpu,
        host=r.host,
        events=r.events,
    )
    return RunView.of(record, view.machine)


def _pids_of_rank(record: RunRecord, rank: int) -> frozenset[int]:
    """The rank's training processes and its DataLoader workers."""
    table = rank_table(record)
    pids = {pid for pid, info in table.items() if info.rank == rank}
    pids |= {s.pid for s in record.steps if s.rank == rank}
    return frozenset(pids)


def _node_load(view: RunView, rank: int) -> dict[str, Any] | None:
    """The rank's node, when a merged record shows it much busier than the others."""
    nodes = view.record.meta.environment.get("nodes")
    if not isinstance(nodes, list) or len(nodes) < 2:
        return None
    info = next((i for i in rank_table(view.record).values() if i.rank == rank), None)
    if info is None or info.node is None:
        return None
    load: dict[object, float] = {
        n.get("hostname"): float(n["others_cpu_mean_cores"])
        for n in nodes
        if isinstance(n, Mapping) and isinstance(n.get("others_cpu_mean_cores"), (int, float))
    }
    mine = load.get(info.node)
    rest = [v for k, v in load.items() if k != info.node]
    if mine is None or not rest or mine < 1.0 or mine < 2.0 * max(rest):
        return None
    return {"node": info.node, "node_others_cpu_cores": mine, "other_nodes_cpu_cores": max(rest)}
