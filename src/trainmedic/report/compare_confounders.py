"""What else differed between the two sides of a comparison, and whether it explains
the change: other processes' CPU, the training thread's wait for a CPU, steal, the
cgroup's throttling, the GPU's clock and its other users, another host or GPU, and runs
still warming up (docs/compare.md, "Verdict"). Each is weighed as the most it could
have cost the slower side; pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainmedic.report.compare_facts import RunFacts

WARMUP_TREND = 0.15
"""A run whose second half of steady steps ran this much faster (or slower) than its
first was still warming up (or slowing down): its rate is no one figure."""
CONFOUNDER_MIN = {"others_cores": 0.25, "wait": 0.05, "steal": 5.0, "throttled": 0.05,
                  "clock": 0.05}  # fmt: skip
"""How much a confounder must differ between the sides to be weighed at all: others'
CPU in cores, shares of time, steal in percent, the GPU's clock as a fraction."""


def warming_up(b: Sequence[RunFacts], a: Sequence[RunFacts]) -> list[tuple[float, str]]:
    """Runs whose second half of steady steps ran :data:`WARMUP_TREND` faster or slower
    than their first: (the most it can move its side's figure, as a factor; in words).

    A run drifting by a factor ``d`` may be off by as much itself; its side's figure, the
    mean of that side's run rates, moves by its weight in that mean: ``1 + w (d - 1)``,
    so one drifting run of three moves its side by about a third of its drift."""
    out = []
    for side in (b, a):
        total = sum(r.rate or 0.0 for r in side)
        for r in side:
            if r.halves is None or min(r.halves) <= 0:
                continue
            first, second = r.halves
            if abs(second / first - 1.0) < WARMUP_TREND:
                continue
            drift = max(second / first, first / second)
            weight = (r.rate or 0.0) / total if total > 0 and len(side) > 1 else 1.0
            how = "speeding up" if second > first else "slowing down"
            out.append((
                1.0 + weight * (drift - 1.0),
                f"{r.name} was still {how}: its second half of steady steps ran "
                f"{second / first:.2f}x the rate of its first (run longer, or the rate "
                "is no one figure)",
            ))  # fmt: skip
    return out


_LOST_TIME: tuple[tuple[str, Callable[[RunFacts], float | None], float, str], ...] = (
    ("wait", lambda r: r.train_cpu_wait_share, 1.0,
     "the training thread waited for a CPU {s:.0%} of its time in {slow} and {f:.0%} in {fast}"),
    ("steal", lambda r: r.steal_pct, 100.0,
     "the hypervisor stole {s:.0f} % of the CPU during {slow} and {f:.0f} % during {fast}"),
    ("throttled", lambda r: r.throttled_share, 1.0,
     "the cgroup's CPU quota stopped the job {s:.0%} of the time in {slow} and {f:.0%} in "
     "{fast}"),
)  # fmt: skip
"""The confounders that take a share of the job's time: (key in :data:`CONFOUNDER_MIN`,
the reading, its scale to a share, the words)."""


def confounders(
    b: RunFacts, a: RunFacts, judged: tuple[float, float], min_effect: float, verdict: str
) -> list[str]:
    """What differs between the sides enough to explain the measured change: each as
    (the largest slow-down it could cause, in words). It explains the change when the
    verdict no longer holds once the slower side is given that much back."""
    lo, hi = judged
    reasons = []
    for most, why in differences(b, a, verdict):
        # Give the slower side back the most this confounder could have cost it.
        if verdict == "faster":
            holds = lo / most > 1.0 + min_effect
        else:
            holds = hi * most < 1.0 - min_effect
        if not holds:
            reasons.append(why + ": enough to explain the change")
    return reasons


def differences(b: RunFacts, a: RunFacts, verdict: str) -> list[tuple[float, str]]:
    """What differs between the sides against the slower one (``verdict``: ``faster``,
    the before side is the slower): each as (the largest slow-down it could cause,
    in words)."""
    slow, fast = (b, a) if verdict == "faster" else (a, b)
    found: list[tuple[float, str]] = []

    def diff(x: float | None, y: float | None) -> float:
        return (x or 0.0) - (y or 0.0)

    others = diff(slow.others_cpu_cores, fast.others_cpu_cores)
    if others >= CONFOUNDER_MIN["others_cores"]:
        cores = slow.usable_cores or fast.usable_cores or 1.0
        found.append((1.0 + others / cores,
                      f"other processes used {slow.others_cpu_cores or 0:.2f} cores during the "
                      f"slower side ({slow.name}) and {fast.others_cpu_cores or 0:.2f} during "
                      f"the faster ({fast.name}), of {cores:g}"))  # fmt: skip
    for key, get, scale, text in _LOST_TIME:
        lost = diff(get(slow), get(fast))
        if lost >= CONFOUNDER_MIN[key]:
            # A share of the time taken from the job slows it by up to 1 / (1 - share).
            found.append((1.0 / max(0.05, 1.0 - lost / scale),
                          text.format(s=get(slow) or 0.0, f=get(fast) or 0.0, slow=slow.name,
                                      fast=fast.name)))  # fmt: skip
    cs, cf = slow.gpu_sm_clock_mhz, fast.gpu_sm_clock_mhz
    if cs and cf and cf / cs - 1.0 >= CONFOUNDER_MIN["clock"]:
        found.append((cf / cs, f"the GPU ran at {cs:.0f} MHz in {slow.name} and {cf:.0f} MHz "
                               f"in {fast.name} (heat or power limits)"))  # fmt: skip
    if slow.foreign_gpu_processes > fast.foreign_gpu_processes:
        found.append((math.inf, f"{slow.foreign_gpu_processes} other process(es) used the GPU "
                                f"during {slow.name}, {fast.foreign_gpu_processes} during "
                                f"{fast.name}"))  # fmt: skip
    if slow.host and fast.host and slow.host != fast.host:
        found.append((math.inf, f"the runs ran on different hosts ({b.host} before, {a.host} "
                                "after)"))  # fmt: skip
    if slow.gpu_models and fast.gpu_models and slow.gpu_models != fast.gpu_models:
        found.append((math.inf, f"the runs ran on different GPUs ({', '.join(b.gpu_models)} "
                                f"before, {', '.join(a.gpu_models)} after)"))  # fmt: skip
    return found
