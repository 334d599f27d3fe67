"""Several nodes' run records as one: ``trainmedic report DIR1 DIR2 ...``.

A job across nodes runs one ``trainmedic run`` per node (each wrapping that
node's ``torchrun``), and each writes its own run directory with its own
clock. :func:`merge_records` puts them on one time line and into one
:class:`~trainmedic.record.types.RunRecord`, so the per-rank statistics and
the straggler rules compare ranks across nodes.

**Clocks.** Ranks in lockstep end each step within milliseconds of each
other (they leave the same all-reduce together), so the same step of two
nodes' lowest ranks marks the same moment. :func:`align_clocks` takes the
median, over the steps both made in their first attempt, of the difference
of their end times: that is the offset of the node's clock from the
reference node's (the one holding the lowest rank). Its accuracy is the
larger of the median absolute deviation of those differences and the
lockstep jitter between ranks of one node (same clock, so whatever spread
they show is the method's own floor) — typically a few milliseconds. Nodes
with fewer than :data:`MIN_PAIRS` common steps keep their wall clocks
(offset 0; accuracy that of NTP, unknown here), and say so.

**Identities.** Process ids and GPU indices repeat across nodes, so the
k-th directory's (k = 0, 1, ...) are shifted: pid + k × :data:`PID_STRIDE`,
GPU index + k × :data:`GPU_STRIDE`; attempts are numbered k × 1000 + n.
Each node's name, offsets and host load go into
``meta.environment["nodes"]``.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainmedic.record.events import EventKind
from trainmedic.record.payloads import PROCESS_KINDS, process_starts
from trainmedic.record.stats import summarize
from trainmedic.record.types import RunEvent, RunMeta, RunRecord

PID_STRIDE = 10_000_000
"""Above Linux's largest pid (2^22): a shifted pid never meets a real one."""
GPU_STRIDE = 100
ATTEMPT_STRIDE = 1000
MIN_PAIRS = 5


@dataclass(frozen=True)
class ClockAlignment:
    """One node's clock against the reference node's.

    Attributes:
        offset_s: seconds to subtract from the node's times to get the reference's.
        accuracy_s: how far that may be off (see the module docstring); ``None``
            when unknown (wall clocks kept).
        pairs: steps compared.
        method: ``lockstep steps`` or ``wall clocks``.
    """

    offset_s: float
    accuracy_s: float | None
    pairs: int
    method: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "clock_offset_s": round(self.offset_s, 6),
            "clock_accuracy_s": None if self.accuracy_s is None else round(self.accuracy_s, 6),
            "clock_pairs": self.pairs,
            "clock_method": self.method,
        }


def lead_steps(record: RunRecord) -> dict[int, float]:
    """step number -> end time of the lowest rank's first-attempt train steps
    (the process of that rank that stepped first)."""
    train = [s for s in record.steps if s.phase == "train"]
    ranked = [s for s in train if s.rank is not None]
    pool = ranked or train
    if not pool:
        return {}
    rank = min((s.rank for s in pool if s.rank is not None), default=None)
    mine = [s for s in pool if s.rank == rank]
    first_pid = min(mine, key=lambda s: s.t - s.duration_s).pid
    return {s.step: s.t for s in mine if s.pid == first_pid}


def lockstep_jitter(record: RunRecord) -> float | None:
    """Median spread of step end times between the ranks of one node (one clock)."""
    by_rank: dict[int, dict[int, float]] = {}
    for s in record.steps:
        if s.rank is not None and s.phase == "train":
            by_rank.setdefault(s.rank, {}).setdefault(s.step, s.t)
    if len(by_rank) < 2:
        return None
    ranks = sorted(by_rank)
    common = set(by_rank[ranks[0]]).intersection(*(by_rank[r] for r in ranks[1:]))
    spreads = [
        max(by_rank[r][n] for r in ranks) - min(by_rank[r][n] for r in ranks) for n in common
    ]
    return statistics.median(spreads) if spreads else None


def align_clocks(reference: RunRecord, other: RunRecord) -> ClockAlignment:
    """``other``'s clock against ``reference``'s (module docstring)."""
    ref, mine = lead_steps(reference), lead_steps(other)
    common = sorted(set(ref) & set(mine))
    if len(common) < MIN_PAIRS:
        return ClockAlignment(0.0, None, len(common), "wall clocks")
    diffs = [mine[n] - ref[n] for n in common]
    offset = statistics.median(diffs)
    mad = statistics.median(abs(d - offset) for d in diffs)
    jitter = [j for j in (lockstep_jitter(reference), lockstep_jitter(other)) if j is not None]
    return ClockAlignment(offset, max([mad, *jitter]), len(common), "lockstep steps")


OVERLAP_SLACK_S = 600.0
"""Two nodes' runs of one job overlap in time; their clocks may differ by this much
(no NTP) before runs apart in time are told from a skewed clock."""


def _ranks(record: RunRecord) -> set[int]:
    """The distributed ranks whose training processes the record holds."""
    ranks = {s.rank for s in record.steps if s.rank is not None}
    for e, p in process_starts(record.events):
        if e.kind == EventKind.PROCESS_START and p.rank is not None and p.role == "process":
            ranks.add(p.rank)
    return ranks


def why_apart(runs: Sequence[tuple[str, RunRecord]]) -> str | None:
    """Why these runs are not the nodes of one distributed job, or ``None`` when they may
    be: each holds ranks, no rank is in two of them, and they ran at the same time
    (within :data:`OVERLAP_SLACK_S`)."""
    seen: dict[str, set[int]] = {}
    for directory, record in runs:
        ranks = _ranks(record)
        if not ranks:
            return (
                f"{directory} holds no distributed ranks: it is not one node of a job "
                "across nodes (report each run on its own, or compare them)"
            )
        for other, other_ranks in seen.items():
            common = ranks & other_ranks
            if common:
                return (
                    f"{other} and {directory} both hold rank {min(common)}: they are two "
                    "runs of the same ranks (two jobs, or one run given twice), not the "
                    "nodes of one job"
                )
        seen[directory] = ranks
    spans = [(d, r.meta.started_at, _ended(r)) for d, r in runs]
    for i, (a, a0, a1) in enumerate(spans):
        for b, b0, b1 in spans[i + 1 :]:
            if a0 > b1 + OVERLAP_SLACK_S or b0 > a1 + OVERLAP_SLACK_S:
                return (
                    f"{a} and {b} did not run at the same time ({_clock(a0)}-{_clock(a1)} "
                    f"and {_clock(b0)}-{_clock(b1)}): not the nodes of one job"
                )
    return None


def _ended(record: RunRecord) -> float:
    last = max((s.t for s in record.steps), default=record.meta.started_at)
    return max(record.meta.ended_at or last, last)


def _clock(t: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def merge_records(runs: Sequence[tuple[str, RunRecord]]) -> RunRecord:
    """One record of several nodes' runs (``(directory, record)`` pairs), on the
    clock of the node that holds the lowest rank (module docstring)."""
    if len(runs) == 1:
        return runs[0][1]
    order = sorted(range(len(runs)), key=lambda i: _lowest_rank(runs[i][1]))
    ref_record = runs[order[0]][1]
    names = _node_names([r for _, r in runs])
    merged = RunRecord(meta=ref_record.meta)
    nodes: list[dict[str, Any]] = []
    for k, i in enumerate(order):
        directory, record = runs[i]
        align = (
            ClockAlignment(0.0, 0.0, 0, "reference")
            if k == 0
            else align_clocks(ref_record, record)
        )
        shifted = _shift(record, k, align.offset_s, names[i])
        merged.steps += shifted.steps
        merged.windows += shifted.windows
        merged.loaders += shifted.loaders
        merged.loader_activity += shifted.loader_activity
        merged.gpu += shifted.gpu
        merged.host += shifted.host
        merged.events += shifted.events
        summary = summarize(record)
        nodes.append(
            {
                "run_dir": directory,
                "hostname": names[i],
                "node_rank": _node_rank(record),
                "ranks": sorted({s.rank for s in record.steps if s.rank is not None}),
                "pid_offset": k * PID_STRIDE,
                "gpu_offset": k * GPU_STRIDE,
                "attempt_offset": k * ATTEMPT_STRIDE,
                "exit_code": record.meta.exit_code,
                "others_cpu_mean_cores": summary.others_cpu_mean_cores,
                "job_cpu_mean_cores": summary.job_cpu_mean_cores,
                "usable_cores": summary.usable_cores,
                **align.to_dict(),
            }
        )
    merged.steps.sort(key=lambda s: s.t)
    merged.windows.sort(key=lambda w: w.t)
    merged.gpu.sort(key=lambda g: g.timestamp)
    merged.host.sort(key=lambda h: h.t)
    merged.events.sort(key=lambda e: e.t)
    metas = [
        _shift_meta(runs[i][1].meta, float(n["clock_offset_s"]))
        for i, n in zip(order, nodes, strict=True)
    ]
    merged.meta = _merged_meta(ref_record.meta, metas, nodes)
    return merged


# --- helpers --------------------------------------------------------------------------------------


def _lowest_rank(record: RunRecord) -> tuple[int, float]:
    ranks = [s.rank for s in record.steps if s.rank is not None]
    return (min(ranks) if ranks else 1 << 30, record.meta.started_at)


def _node_rank(record: RunRecord) -> int | None:
    for e, p in process_starts(record.events):
        if e.kind == EventKind.PROCESS_START and p.node_rank is not None:
            return p.node_rank
    return None


def _hostname(record: RunRecord) -> str | None:
    for e, p in process_starts(record.events):
        if e.kind == EventKind.PROCESS_START and p.node is not None:
            return p.node
    host = record.meta.environment.get("host")
    if isinstance(host, Mapping) and isinstance(host.get("hostname"), str):
        return str(host["hostname"])
    return None


def _node_names(records: Sequence[RunRecord]) -> list[str]:
    """Each record's node name; two records of one host (nodes simulated on one
    machine) are told apart by their node rank, else their position."""
    names = [_hostname(r) or f"node{i}" for i, r in enumerate(records)]
    out = []
    for i, (name, record) in enumerate(zip(names, records, strict=True)):
        if names.count(name) > 1:
            node_rank = _node_rank(record)
            name = f"{name}/{node_rank if node_rank is not None else i}"
        out.append(name)
    return out


def _shift(record: RunRecord, k: int, offset: float, node: str) -> RunRecord:
    dp, dg = k * PID_STRIDE, k * GPU_STRIDE

    def pid(p: int | None) -> int | None:
        return None if p is None or (p == 0 and k == 0) else p + dp

    steps = [dataclasses.replace(s, t=s.t - offset, pid=s.pid + dp) for s in record.steps]
    windows = [
        dataclasses.replace(w, t=w.t - offset, t_start=w.t_start - offset, pid=w.pid + dp)
        for w in record.windows
    ]
    loaders = [dataclasses.replace(lo, t=lo.t - offset, pid=lo.pid + dp) for lo in record.loaders]
    activity = [
        dataclasses.replace(a, t=a.t - offset, pid=a.pid + dp) for a in record.loader_activity
    ]
    gpu = [
        dataclasses.replace(
            g,
            timestamp=g.timestamp - offset,
            index=g.index + dg,
            processes=tuple(dataclasses.replace(p, pid=p.pid + dp) for p in g.processes),
        )
        for g in record.gpu
    ]
    host = [dataclasses.replace(h, t=h.t - offset) for h in record.host]
    events = [_shift_event(e, k, offset, dp, node, pid) for e in record.events]
    return RunRecord(record.meta, steps, windows, loaders, activity, gpu, host, events)


def _shift_event(
    e: RunEvent, k: int, offset: float, dp: int, node: str, pid: Any
) -> RunEvent:
    data = dict(e.data)
    if e.kind in PROCESS_KINDS:
        for key in ("pid", "ppid"):
            if isinstance(data.get(key), int):
                data[key] = data[key] + dp
        data["node"] = node
    attempt_kinds = (EventKind.ATTEMPT_END, EventKind.JOB_START, EventKind.HANG_DETECTED)
    if e.kind in attempt_kinds and isinstance(
        data.get("number" if e.kind == EventKind.ATTEMPT_END else "attempt"), int
    ):
        key = "number" if e.kind == EventKind.ATTEMPT_END else "attempt"
        data[key] = data[key] + k * ATTEMPT_STRIDE
        data["node"] = node
        for t_key in ("started_at", "ended_at", "first_step_start", "last_step_end",
                      "hang_started_at", "detected_at"):  # fmt: skip
            if isinstance(data.get(t_key), (int, float)):
                data[t_key] = data[t_key] - offset
    message = e.message if k == 0 else f"[{node}] {e.message}"
    return dataclasses.replace(e, t=e.t - offset, pid=pid(e.pid), data=data, message=message)


def _shift_meta(m: RunMeta, offset: float) -> RunMeta:
    return dataclasses.replace(
        m,
        started_at=m.started_at - offset,
        ended_at=None if m.ended_at is None else m.ended_at - offset,
    )


def _merged_meta(
    ref: RunMeta, metas: Sequence[RunMeta], nodes: list[dict[str, Any]]
) -> RunMeta:
    ends = [m.ended_at for m in metas]
    codes = [m.exit_code for m in metas]
    failed = [c for c in codes if c not in (0, None)]
    environment = dict(ref.environment)
    environment["nodes"] = nodes
    return dataclasses.replace(
        ref,
        run_id=" + ".join(m.run_id for m in metas),
        started_at=min(m.started_at for m in metas),
        ended_at=None if any(e is None for e in ends) else max(e for e in ends if e is not None),
        exit_code=failed[0] if failed else (0 if all(c == 0 for c in codes) else None),
        environment=environment,
    )


__all__ = [
    "GPU_STRIDE",
    "MIN_PAIRS",
    "PID_STRIDE",
    "ClockAlignment",
    "align_clocks",
    "lead_steps",
    "lockstep_jitter",
    "merge_records",
]
