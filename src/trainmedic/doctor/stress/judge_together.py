"""Slow with every GPU running, or slow alone too: what the one-at-a-time matmuls tell.

On a machine with more than one selected GPU each GPU also runs a short matmul pass
alone, in its best dtype (:mod:`.runner`). A GPU that computes fast alone but slower when
every GPU runs is held back by what the GPUs share: power delivery and cooling
(``thermal`` when the GPU reported a slowdown reason or its clock fell, else
``gpu_capacity``: the machine cannot run its GPUs at full speed together). A GPU slower
than its same-model peers alone too, or under half its datasheet's peak alone, is slow
itself (``gpu_capacity``). Pure functions from a :class:`~.results.StressResult`.
"""

from __future__ import annotations

from typing import Any

from trainmedic.doctor.stress.judge_health import CLOCK_FALL_MIN, MIN_READINGS, leading_slowdown
from trainmedic.doctor.stress.results import GpuStress, StressResult, median
from trainmedic.findings.model import Category, Finding, Severity

TOGETHER_MIN_SHARE = 0.9
"""A GPU computing under this share of its own alone rate while every GPU runs is slowed
by running together (a healthy machine feeds every GPU: 95-100 %)."""
ALONE_MIN_PEER_RATIO = 0.9
"""Alone, a GPU under this share of its same-model peers' median alone rate is slow
itself (the same bar as the all-at-once comparison)."""
ALONE_MIN_PEAK_SHARE = 0.5
"""Alone, a GPU under this share of its datasheet's peak is slow itself (the bar of
``stress.matmul_below_datasheet``)."""


def _pct(share: float) -> str:
    return f"{share:.0%}".replace("%", " %")


def _alone(g: GpuStress) -> tuple[str, float] | None:
    """The dtype the GPU ran alone and its TFLOP/s there."""
    for dtype, rate in g.tflops_alone.items():
        return dtype, rate.mean
    return None


def _clock_fell(g: GpuStress) -> bool:
    clock = g.readings.sm_clock_mhz
    if clock is None or clock.start <= 0 or g.readings.samples < MIN_READINGS:
        return False
    return (clock.low - clock.start) / clock.start <= -CLOCK_FALL_MIN


def _evidence(g: GpuStress, dtype: str) -> dict[str, Any]:
    r = g.readings
    return {
        "dtype": dtype,
        "tflops_alone": g.tflops_alone[dtype].mean,
        "tflops_together": g.tflops[dtype].mean if dtype in g.tflops else None,
        "together_share": g.together_share(dtype),
        "peak_share_alone": _peak_share(g, dtype),
        "sm_clock_mhz": None if r.sm_clock_mhz is None else r.sm_clock_mhz.to_dict(),
        "power_w": None if r.power_w is None else r.power_w.to_dict(),
        "power_limit_w": r.power_limit_w,
        "clock_event_shares": dict(r.reason_shares),
    }


def _peak_share(g: GpuStress, dtype: str) -> float | None:
    peak = g.datasheet.tflops.get(dtype) if g.datasheet else None
    rate = g.tflops_alone.get(dtype)
    return None if not peak or rate is None else round(rate.mean / peak, 4)


def _slow_alone(g: GpuStress, result: StressResult) -> Finding | None:
    from trainmedic.doctor.stress.judge import MATMUL_TYPICAL_PEAK_SHARE, gpu_list

    alone = _alone(g)
    if alone is None:
        return None
    dtype, mine = alone
    peers = [o for o in result.gpus if o is not g and o.name == g.name and dtype in o.tflops_alone]
    theirs = median([o.tflops_alone[dtype].mean for o in peers]) if peers else None
    share = _peak_share(g, dtype)
    below_peers = theirs is not None and theirs > 0 and mine < ALONE_MIN_PEER_RATIO * theirs
    below_sheet = share is not None and share < ALONE_MIN_PEAK_SHARE
    if not (below_peers or below_sheet):
        return None
    if below_peers and theirs is not None:
        verb = "reaches" if len(peers) == 1 else "reach"
        than = f"while {gpu_list([o.index for o in peers])} {verb} {theirs:.0f} alone"
        impact = 1 - mine / theirs
    else:
        assert share is not None
        than = f"{_pct(share)} of its datasheet's peak"
        impact = 1 - share / MATMUL_TYPICAL_PEAK_SHARE
    lead = leading_slowdown(g)
    clause = f"; {lead[0].name} active {_pct(lead[1])} of the time" if lead else ""
    return Finding(
        id="stress.matmul_slow_alone",
        category=Category.GPU_CAPACITY,
        severity=Severity.WARNING,
        title=(
            f"GPU {g.index} is slow alone too: {mine:.0f} TFLOP/s in {dtype} with no other "
            f"GPU running, {than}" + clause
        ),
        evidence={
            **_evidence(g, dtype),
            "peers": [o.index for o in peers],
            "peers_median_tflops_alone": None if theirs is None else round(theirs, 3),
            "min_peer_ratio": ALONE_MIN_PEER_RATIO,
            "min_peak_share": ALONE_MIN_PEAK_SHARE,
        },
        detail="It is as slow with the machine's power and cooling to itself: the GPU itself "
        "(its clocks, its power limit, or the board), not the load of the others.",
        fix=lead[0].fix.replace("<index>", str(g.index))
        if lead
        else f"Compare its power limit and clocks with the others (nvidia-smi -i {g.index} -q "
        "-d POWER,CLOCK,PERFORMANCE); reset application clocks (nvidia-smi -rac); if it stays "
        "slow alone at full clock and cool, report the GPU to the provider or drain it.",
        impact=round(min(1.0, max(0.0, impact)), 4),
        subject=f"gpu{g.index}",
    )


def _slower_together(g: GpuStress) -> Finding | None:
    alone = _alone(g)
    if alone is None:
        return None
    dtype, mine_alone = alone
    share = g.together_share(dtype)
    if share is None or share >= TOGETHER_MIN_SHARE:
        return None
    lead = leading_slowdown(g)
    limited = lead is not None or _clock_fell(g)
    together = g.tflops[dtype].mean
    title = (
        f"GPU {g.index} computes {together:.0f} TFLOP/s in {dtype} with every GPU running, "
        f"{_pct(share)} of the {mine_alone:.0f} it reaches alone"
    )
    if lead is not None:
        title += f"; {lead[0].name} active {_pct(lead[1])} of the time"
    if limited:
        fix = (
            lead[0].fix.replace("<index>", str(g.index))
            if lead is not None
            else f"Watch GPU {g.index} with every GPU loaded (nvidia-smi -q -d "
            "POWER,TEMPERATURE,PERFORMANCE -l 1): the chassis' airflow and the power supply "
            "must carry all GPUs at full load at once; ask the provider for the node's power "
            "budget."
        )
    else:
        fix = (
            f"GPU {g.index} reports no slowdown reason, yet loses speed only when every GPU "
            "runs: compare power draw and clocks with one GPU and with all loaded (nvidia-smi "
            "-q -d POWER,CLOCK -l 1), and ask the provider whether the node's power supply "
            "or cooling is shared or capped; data-parallel training steps at this pace."
        )
    return Finding(
        id="stress.matmul_slower_together",
        category=Category.THERMAL if limited else Category.GPU_CAPACITY,
        severity=Severity.WARNING,
        title=title,
        evidence={**_evidence(g, dtype), "min_together_share": TOGETHER_MIN_SHARE},
        detail="Alone it reaches its speed, so the GPU itself is sound: what all the GPUs share "
        "(power delivery, cooling) holds it back when they all run, as in training.",
        fix=fix,
        impact=round(min(1.0, 1 - share), 4),
        subject=f"gpu{g.index}",
    )


def check_matmul_together(result: StressResult) -> list[Finding]:
    """Per GPU with an alone figure: slow alone too (:data:`ALONE_MIN_PEER_RATIO`,
    :data:`ALONE_MIN_PEAK_SHARE`), else slower together than alone
    (:data:`TOGETHER_MIN_SHARE`)."""
    out = []
    for g in result.gpus:
        found = _slow_alone(g, result) or _slower_together(g)
        if found is not None:
            out.append(found)
    return out
