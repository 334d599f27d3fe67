"""Distributed runs: stragglers, GPU load imbalance, collective timeouts.

Ranks of a data-parallel job move in lockstep: every step ends in collectives
(DDP's gradient all-reduce) that no rank leaves before the last one arrives.
A rank that is slower at something of its own — its data, its GPU — makes
every other rank wait for it in those collectives, every step. The others'
step time then equals the straggler's, so pooled figures hide it; comparing
the ranks step by step shows it (docs/diagnosis.md, "Distributed runs").

**How the wait is measured.** The time the others spend waiting in
collectives is *inferred* from the steps the ranks made in lockstep
(:func:`trainmedic.record.ranks.aligned_steps`): in one step, a rank that
waited ``w_s`` for its own batch while another waited ``w_r`` holds that
other back by ``w_s - w_r`` — the other finished its own part that much
earlier and sat in the all-reduce meanwhile. Data wait is the right part to
compare because it is never a wait on peers (it is measured inside the
DataLoader, or as host time outside forward/backward/optimizer). On CPU
(gloo) DDP's all-reduce waits inside ``backward``, so the others' compute
time exceeds the straggler's by about the same amount: reported as
``others_wait_in_backward_s``, a second reading of the same wait. Without a
DataLoader, host time outside forward/backward/optimizer may itself be a wait
on the peers (an ``all_reduce`` of metrics), so the rank's own stacks between
steps must show it preparing data. Python-level collectives and DDP's C++
reducer are not wrapped by the probe: wrapping would cost every job and
still miss the reducer's waits, which run inside the autograd engine.

A GPU that holds its clock down (heat, power) makes its rank the straggler
with no difference in data wait; its rank is named from its clock and
slowdown reasons, and the wait it costs the others is estimated from the
clock ratio. GPUs loaded unevenly without such a cause are reported as load
imbalance (``gpu_capacity``).

Every distributed run also gets the collective timeout and watchdog
settings that fit its observed step and phase times (``timeout``, info).

The package, by job: :mod:`.thresholds` (the rules' limits), :mod:`.compare`
(rank statistics compared step by step; uneven batches),
:mod:`.data_straggler`, :mod:`.gpu` (GPU straggler and load imbalance),
:mod:`.timeouts` (collective timeout settings), :mod:`.units`.
"""

from __future__ import annotations

from trainmedic.diagnose.ranks.compare import Holdback, compare_ranks, uneven_batches
from trainmedic.diagnose.ranks.data_straggler import data_straggler
from trainmedic.diagnose.ranks.gpu import gpu_imbalance, gpu_straggler
from trainmedic.diagnose.ranks.thresholds import DEFAULT_RANK_THRESHOLDS, RankThresholds
from trainmedic.diagnose.ranks.timeouts import collective_timeout
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Finding
from trainmedic.record.ranks import rank_stats


def distributed(view: RunView, th: Thresholds) -> list[Finding]:
    """Every finding about the ranks of a distributed run (none for one rank)."""
    return distributed_findings(view, th, DEFAULT_RANK_THRESHOLDS)


def distributed_findings(view: RunView, th: Thresholds, rt: RankThresholds) -> list[Finding]:
    stats = rank_stats(view.record, view.split)
    if len(stats) < 2:
        return []
    findings: list[Finding] = []
    straggler = data_straggler(view, th, rt, stats) or gpu_straggler(view, rt, stats)
    if straggler is not None:
        findings.append(straggler)
    else:
        findings.extend(gpu_imbalance(view, rt, stats))
    findings.extend(uneven_batches(rt, stats))
    findings.extend(collective_timeout(view, rt, stats))
    return findings


__all__ = [
    "DEFAULT_RANK_THRESHOLDS",
    "Holdback",
    "RankThresholds",
    "collective_timeout",
    "compare_ranks",
    "data_straggler",
    "distributed",
    "distributed_findings",
    "gpu_imbalance",
    "gpu_straggler",
    "uneven_batches",
]
