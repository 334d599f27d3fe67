"""A hung distributed job is a hung group: which rank stopped first.

In a job of several ranks moving in lockstep, one rank that stops (blocked in
a lock, stuck on its data source, spinning, crashed in a way that leaves it
alive) parks every other rank in the next collective, where they wait on it
— a rank parked in a collective is waiting on a peer, never working. The
whole group is then hung, and the rank worth naming is the one that stopped
first. :func:`first_stopped` names it from the silence evidence of every
process (:mod:`trainmedic.resilience.silence`) and each rank's progress:

1. a rank (or a DataLoader worker of it) that is *not* waiting on its peers —
   blocked, spinning, waiting on a source — stopped on its own: the others
   wait for it. When several did, the one whose last step is oldest;
2. when every rank waits in a collective (a collective one rank never
   reached, a rank that skipped one), the rank whose last step is oldest — or
   that completed the fewest steps — is the one the others wait for;
3. otherwise nothing can be told (every rank stopped at the same step, at the
   same moment): ``None``.

Pure: evidence and progress in, a :class:`StoppedRank` out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from trainmedic.resilience.silence_evidence import JobEvidence, ProcessEvidence, Silence

STEP_SKEW_S = 0.5
"""Last steps closer together than this (seconds) tell no order: ranks in lockstep
end each step within milliseconds of each other, so half a second apart is a rank
that stopped a step (or more) earlier."""


@dataclass(frozen=True)
class RankProgress:
    """How far one rank got in the attempt.

    Attributes:
        steps: train steps it completed.
        last_step_end: Unix time its last step ended (``None`` before the first).
    """

    rank: int
    pid: int
    steps: int
    last_step_end: float | None


@dataclass(frozen=True)
class StoppedRank:
    """The rank the others wait for.

    Attributes:
        why: how it was told, for a person (``"not in a collective: off the CPU
            ..."``, ``"its last step (41) ended 3.2 s before the others'"``).
        silence: its own class (``blocked``, ``peer_wait``, ...), when known.
    """

    rank: int
    pid: int
    why: str
    silence: str | None = None

    def to_data(self) -> dict[str, object]:
        data: dict[str, object] = {"rank": self.rank, "pid": self.pid, "why": self.why}
        if self.silence is not None:
            data["silence"] = self.silence
        return data


def first_stopped(
    evidence: JobEvidence | None, progress: Mapping[int, RankProgress]
) -> StoppedRank | None:
    """The rank that stopped first (module docstring); ``None`` for a job of fewer
    than two ranks or when nothing tells them apart.

    Args:
        evidence: the last silence evidence of the job (every process), if any.
        progress: each rank's progress, by rank.
    """
    ranks = set(progress)
    if evidence is not None:
        ranks |= {p.rank for p in evidence.processes if p.rank is not None}
    if len(ranks) < 2:
        return None
    pid_of = {r: p.pid for r, p in progress.items()}
    on_its_own: dict[int, ProcessEvidence] = {}
    if evidence is not None:
        for p in evidence.processes:
            if p.rank is None or not p.silence.hang or p.silence is Silence.PEER_WAIT:
                continue
            known = on_its_own.get(p.rank)
            # The rank's main process tells more than one of its workers.
            if known is None or (known.role == "worker" and p.role != "worker"):
                on_its_own[p.rank] = p
            pid_of.setdefault(p.rank, p.pid)
        for p in evidence.processes:
            if p.rank is not None and p.role != "worker":
                pid_of[p.rank] = pid_of.get(p.rank, p.pid)
    if on_its_own:
        rank = min(on_its_own, key=lambda r: _age_key(progress.get(r)))
        p = on_its_own[rank]
        who = "" if p.role != "worker" else f"its DataLoader worker {p.pid} "
        return StoppedRank(
            rank,
            pid_of.get(rank, p.pid),
            f"not in a collective: {who}{p.why}",
            p.silence.value,
        )
    return _oldest(progress, evidence)


def _age_key(p: RankProgress | None) -> tuple[float, int]:
    if p is None or p.last_step_end is None:
        return (float("-inf"), 0)
    return (p.last_step_end, p.steps)


def _oldest(
    progress: Mapping[int, RankProgress], evidence: JobEvidence | None
) -> StoppedRank | None:
    """The rank whose last step is oldest, when it stands apart from the others."""
    known = [p for p in progress.values() if p.last_step_end is not None]
    if len(known) < 2:
        return None
    ordered = sorted(known, key=lambda p: (p.last_step_end or 0.0, p.steps))
    first, second = ordered[0], ordered[1]
    gap = (second.last_step_end or 0.0) - (first.last_step_end or 0.0)
    fewer = first.steps < min(p.steps for p in ordered[1:])
    if gap < STEP_SKEW_S and not fewer:
        return None
    silence = None
    if evidence is not None:
        mine = [p for p in evidence.processes if p.pid == first.pid]
        silence = mine[0].silence.value if mine else None
    what = f"its last step ({first.steps}) ended {gap:.1f} s before the next rank's"
    if fewer:
        what = (
            f"it completed {first.steps} step(s), the others "
            f"{min(p.steps for p in ordered[1:])} or more; {what}"
        )
    return StoppedRank(first.rank, first.pid, what, silence)


__all__ = ["STEP_SKEW_S", "RankProgress", "StoppedRank", "first_stopped"]
