"""What a stress run's figures say: each against the GPU's datasheet and its peers.

Pure functions from a :class:`~.results.StressResult` to findings (ids ``stress.*``,
docs/stress.md lists them with their thresholds): compute and memory bandwidth against
the datasheet and against the machine's other GPUs of the same model, host copies against
what the PCIe link allows, copies between GPUs, and one summary per GPU; each GPU alone
against itself among the others is :mod:`.judge_together`. The health side
(memory test, ECC, clocks, heat, dcgmi) is :mod:`.judge_health`; :func:`judge_stress`
runs both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from trainmedic.doctor.stress import datasheet
from trainmedic.doctor.stress.judge_health import HEALTH_CHECKS, leading_slowdown
from trainmedic.doctor.stress.judge_together import check_matmul_together
from trainmedic.doctor.stress.results import GpuStress, Rate, StressResult, median
from trainmedic.findings.model import Category, Finding, Severity, rank_findings

MATMUL_MIN_PEAK_SHARE = 0.5
"""Below this share of the datasheet's dense peak, a matmul figure is a warning: cuBLAS
reaches 70-90 % of it on a healthy data-centre GPU with large square matrices."""
MATMUL_TYPICAL_PEAK_SHARE = 0.75
"""The share a healthy GPU reaches; the impact of a low figure is measured against it."""
MEMORY_MIN_PEAK_SHARE = 0.6
"""Below this share of the datasheet's memory bandwidth, device copies are a warning
(healthy GPUs copy at 75-92 % of it)."""
MEMORY_TYPICAL_PEAK_SHARE = 0.85
PEER_MIN_RATIO = 0.9
"""A GPU under this share of the median of its same-model peers is slower than them."""
HOST_LINK_MIN_SHARE = 0.6
"""Pinned host copies under this share of what the PCIe link allows are a warning
(healthy links carry 80-90 % of it)."""
PAIR_MIN_RATIO = 0.5
"""A pair of GPUs copying under half the median of all pairs is a slow path."""
NVLINK_MIN_SHARE = 0.5
"""Peer copies under half of one direction of the datasheet's NVLink bandwidth mean
the copy does not use NVLink at its speed."""

HEADLINE_DTYPES = ("bf16", "fp16", "tf32", "fp32", "fp8")
"""The dtype GPUs are compared in: the first all of them measured."""

Check = Callable[[StressResult], list[Finding]]


def gpu_list(indices: Sequence[int]) -> str:
    """``[0, 1, 2]`` -> ``GPUs 0-2``; ``[0, 2]`` -> ``GPUs 0, 2``; ``[3]`` -> ``GPU 3``."""
    ordered = sorted(indices)
    if len(ordered) == 1:
        return f"GPU {ordered[0]}"
    if ordered == list(range(ordered[0], ordered[-1] + 1)) and len(ordered) > 2:
        return f"GPUs {ordered[0]}-{ordered[-1]}"
    return "GPUs " + ", ".join(str(i) for i in ordered)


def _pct(share: float) -> str:
    return f"{share:.0%}".replace("%", " %")


def _subject(g: GpuStress) -> str:
    return f"gpu{g.index}"


def _model(g: GpuStress) -> str:
    return g.datasheet.model if g.datasheet else g.name


def check_matmul_datasheet(result: StressResult) -> list[Finding]:
    """Each GPU's dtypes under :data:`MATMUL_MIN_PEAK_SHARE` of the datasheet's peak."""
    out = []
    for g in result.gpus:
        low = {
            d: s
            for d in g.tflops
            if (s := g.peak_share(d)) is not None and s < MATMUL_MIN_PEAK_SHARE
        }
        if not low or g.datasheet is None:
            continue
        worst = min(low, key=lambda d: low[d])
        share = low[worst]
        peak = g.datasheet.tflops[worst]
        out.append(
            Finding(
                id="stress.matmul_below_datasheet",
                category=Category.GPU_CAPACITY,
                severity=Severity.WARNING,
                title=(
                    f"GPU {g.index} ({_model(g)}) reaches {g.tflops[worst].mean:.0f} TFLOP/s in "
                    f"{worst}, {_pct(share)} of its datasheet's {peak:g}" + _slowdown_clause(g)
                ),
                evidence={
                    "tflops": {d: g.tflops[d].mean for d in g.tflops},
                    "peak_share": {d: g.peak_share(d) for d in g.tflops},
                    "below_min_share": sorted(low),
                    "min_peak_share": MATMUL_MIN_PEAK_SHARE,
                    "datasheet_tflops": dict(g.datasheet.tflops),
                    "datasheet": g.datasheet.source,
                    **_clock_evidence(g),
                },
                fix=_capacity_fix(g),
                impact=_impact(share, MATMUL_TYPICAL_PEAK_SHARE),
                subject=_subject(g),
            )
        )
    return out


def check_matmul_peers(result: StressResult) -> list[Finding]:
    """A GPU slower than the median of the others of its model, in the headline dtype."""
    out = []
    for group in _same_model(result.gpus):
        dtype = next((d for d in HEADLINE_DTYPES if all(d in g.tflops for g in group)), None)
        if dtype is None:
            continue
        for g in group:
            others = [o for o in group if o is not g]
            theirs = median([o.tflops[dtype].mean for o in others])
            mine = g.tflops[dtype].mean
            if theirs <= 0 or mine >= PEER_MIN_RATIO * theirs:
                continue
            names = gpu_list([o.index for o in others])
            share, their_share = g.peak_share(dtype), _median_share(others, dtype)
            if share is not None and their_share is not None:
                title = (
                    f"GPU {g.index} reaches {_pct(share)} of its {dtype} peak while "
                    f"{names} reach {_pct(their_share)}"
                )
            else:
                title = (
                    f"GPU {g.index} reaches {mine:.0f} TFLOP/s in {dtype} while {names} "
                    f"reach {theirs:.0f}"
                )
            out.append(
                Finding(
                    id="stress.matmul_slower_than_peers",
                    category=Category.GPU_CAPACITY,
                    severity=Severity.WARNING,
                    title=title + _slowdown_clause(g),
                    evidence={
                        "dtype": dtype,
                        "tflops": mine,
                        "peers_median_tflops": round(theirs, 3),
                        "peers": [o.index for o in others],
                        "ratio_to_peers": round(mine / theirs, 4),
                        "min_ratio": PEER_MIN_RATIO,
                        "peak_share": share,
                        "peers_peak_share": their_share,
                        **_clock_evidence(g),
                    },
                    fix=_capacity_fix(g),
                    impact=round(min(1.0, 1 - mine / theirs), 4),
                    subject=_subject(g),
                    detail="Data-parallel training steps at the pace of the slowest GPU: every "
                    "other GPU waits for this one at each gradient all-reduce.",
                )
            )
    return out


def check_memory_bandwidth(result: StressResult) -> list[Finding]:
    """Device copies under :data:`MEMORY_MIN_PEAK_SHARE` of the datasheet, or under
    :data:`PEER_MIN_RATIO` of the same-model peers."""
    out = []
    for g in result.gpus:
        rate = g.memory_gb_per_s
        if rate is None or g.datasheet is None:
            continue
        share = rate.mean / g.datasheet.memory_gb_per_s
        if share < MEMORY_MIN_PEAK_SHARE:
            out.append(
                Finding(
                    id="stress.memory_bandwidth_below_datasheet",
                    category=Category.GPU_CAPACITY,
                    severity=Severity.WARNING,
                    title=(
                        f"GPU {g.index} copies device memory at {rate.mean:.0f} GB/s, "
                        f"{_pct(share)} of its datasheet's {g.datasheet.memory_gb_per_s:g} GB/s"
                    ),
                    evidence={
                        "memory_gb_per_s": rate.mean,
                        "peak_share": round(share, 4),
                        "datasheet_gb_per_s": g.datasheet.memory_gb_per_s,
                        "min_peak_share": MEMORY_MIN_PEAK_SHARE,
                        "datasheet": g.datasheet.source,
                        **_clock_evidence(g),
                    },
                    fix=_capacity_fix(g),
                    impact=_impact(share, MEMORY_TYPICAL_PEAK_SHARE),
                    subject=_subject(g),
                )
            )
    for group in _same_model(result.gpus):
        rated = [g for g in group if g.memory_gb_per_s is not None]
        for g in rated:
            others = [o for o in rated if o is not g]
            if not others:
                continue
            assert g.memory_gb_per_s is not None
            theirs = median([o.memory_gb_per_s.mean for o in others if o.memory_gb_per_s])
            mine = g.memory_gb_per_s.mean
            if theirs > 0 and mine < PEER_MIN_RATIO * theirs:
                names = gpu_list([o.index for o in others])
                out.append(
                    Finding(
                        id="stress.memory_bandwidth_slower_than_peers",
                        category=Category.GPU_CAPACITY,
                        severity=Severity.WARNING,
                        title=(
                            f"GPU {g.index} copies device memory at {mine:.0f} GB/s while "
                            f"{names} reach {theirs:.0f} GB/s"
                        ),
                        evidence={
                            "memory_gb_per_s": mine,
                            "peers_median_gb_per_s": theirs,
                            "peers": [o.index for o in others],
                            "ratio_to_peers": round(mine / theirs, 4),
                            "min_ratio": PEER_MIN_RATIO,
                        },
                        fix=_capacity_fix(g),
                        impact=round(min(1.0, 1 - mine / theirs), 4),
                        subject=_subject(g),
                    )
                )
    return out


def check_host_link(result: StressResult) -> list[Finding]:
    """Pinned host copies against the PCIe link's maximum; a link that did not train up to
    its maximum under load."""
    out = []
    for g in result.gpus:
        allowed = datasheet.pcie_gb_per_s(g.link.gen_max, g.link.width_max)
        gen, width = g.readings.link_gen_under_load, g.readings.link_width_under_load
        link_ev = {
            "pcie_gen_max": g.link.gen_max,
            "pcie_width_max": g.link.width_max,
            "pcie_gen_under_load": gen,
            "pcie_width_under_load": width,
            "link_allows_gb_per_s": allowed,
        }
        degraded = (gen is not None and g.link.gen_max is not None and gen < g.link.gen_max) or (
            width is not None and g.link.width_max is not None and width < g.link.width_max
        )
        if degraded:
            out.append(
                Finding(
                    id="stress.pcie_link_degraded_under_load",
                    category=Category.HARDWARE_FAULT,
                    severity=Severity.WARNING,
                    title=(
                        f"GPU {g.index}'s PCIe link ran at Gen{gen} x{width} under load, "
                        f"below its Gen{g.link.gen_max} x{g.link.width_max}"
                    ),
                    evidence=link_ev,
                    fix="Reseat the GPU or its riser and check the slot's BIOS setting (PCIe "
                    "speed 'Auto'/'GenN'); a link that trains down under load is a signal "
                    "integrity fault: on a rented machine, report the node.",
                    impact=None,
                    subject=_subject(g),
                )
            )
        if allowed is None:
            continue
        pinned = {k: v.mean for k, v in g.host_gb_per_s.items() if k.endswith("_pinned")}
        slow = {k: v for k, v in pinned.items() if v < HOST_LINK_MIN_SHARE * allowed}
        if slow:
            worst = min(slow, key=lambda k: slow[k])
            out.append(
                Finding(
                    id="stress.host_bandwidth_below_link",
                    category=Category.GPU_CAPACITY,
                    severity=Severity.WARNING,
                    title=(
                        f"GPU {g.index} moves {slow[worst]:.1f} GB/s {_direction(worst)} from "
                        f"pinned memory, {_pct(slow[worst] / allowed)} of the "
                        f"{allowed:.1f} GB/s its Gen{g.link.gen_max} x{g.link.width_max} "
                        "link allows"
                    ),
                    evidence={
                        **link_ev,
                        "host_gb_per_s": {k: v.mean for k, v in g.host_gb_per_s.items()},
                        "min_link_share": HOST_LINK_MIN_SHARE,
                    },
                    fix="Check the link under load (nvidia-smi -q -d PCIE), the NUMA placement "
                    "(nvidia-smi topo -m: run on the GPU's own CPU socket, numactl "
                    "--cpunodebind), and the IOMMU (iommu=pt); a PCIe switch shared by several "
                    "GPUs divides its uplink.",
                    impact=round(1 - slow[worst] / allowed, 4),
                    subject=_subject(g),
                )
            )
    return out


def check_peers(result: StressResult) -> list[Finding]:
    """GPU pairs without peer access, pairs far slower than the others, and NVLink pairs
    under :data:`NVLINK_MIN_SHARE` of one direction of the datasheet's NVLink."""
    out = []
    missing = [(p.src, p.dst) for p in result.peers if p.gb_per_s is None]
    if missing:
        out.append(
            Finding(
                id="stress.no_peer_access",
                category=Category.DRIVER,
                severity=Severity.WARNING,
                title=(
                    f"{len(missing)} of {len(result.peers)} GPU pairs have no peer access "
                    f"(first: GPU {missing[0][0]} to GPU {missing[0][1]}): their copies go "
                    "through host memory"
                ),
                evidence={"pairs_without_peer_access": [list(p) for p in missing]},
                fix="Check nvidia-smi topo -p2p r; on PCIe machines peer access needs the IOMMU "
                "in passthrough (iommu=pt) and PCIe ACS off on the switches between the GPUs; "
                "GeForce boards have none. NCCL then stages through host memory: slower "
                "all-reduce.",
                impact=None,
                subject="gpus",
            )
        )
    rated = [p for p in result.peers if p.gb_per_s is not None]
    if len(rated) >= 2:
        typical = median([p.gb_per_s.mean for p in rated if p.gb_per_s])
        for p in rated:
            assert p.gb_per_s is not None
            if typical > 0 and p.gb_per_s.mean < PAIR_MIN_RATIO * typical:
                out.append(_slow_pair(p.src, p.dst, p.gb_per_s, typical))
    by_index = {g.index: g for g in result.gpus}
    for p in rated:
        assert p.gb_per_s is not None
        a, b = by_index.get(p.src), by_index.get(p.dst)
        links = [g.datasheet.nvlink_gb_per_s for g in (a, b) if g and g.datasheet]
        if len(links) != 2 or None in links:
            continue
        one_way = min(x for x in links if x is not None) / 2
        if p.gb_per_s.mean < NVLINK_MIN_SHARE * one_way:
            out.append(
                Finding(
                    id="stress.peer_bandwidth_below_nvlink",
                    category=Category.GPU_CAPACITY,
                    severity=Severity.WARNING,
                    title=(
                        f"GPU {p.src} copies to GPU {p.dst} at {p.gb_per_s.mean:.0f} GB/s, "
                        f"{_pct(p.gb_per_s.mean / one_way)} of the {one_way:g} GB/s one "
                        "direction of NVLink allows"
                    ),
                    evidence={
                        "gb_per_s": p.gb_per_s.mean,
                        "nvlink_one_way_gb_per_s": one_way,
                        "min_share": NVLINK_MIN_SHARE,
                    },
                    fix="Check the links: nvidia-smi nvlink --status and nvidia-smi topo -m "
                    "(NV# between the two, not PIX/SYS); on NVSwitch machines Fabric Manager "
                    "must run; inactive links need the node drained and checked.",
                    impact=round(1 - p.gb_per_s.mean / one_way, 4),
                    subject=f"gpu{p.src}-gpu{p.dst}",
                )
            )
    return out


def _slow_pair(src: int, dst: int, rate: Rate, typical: float) -> Finding:
    return Finding(
        id="stress.peer_bandwidth_slower_than_pairs",
        category=Category.GPU_CAPACITY,
        severity=Severity.WARNING,
        title=(
            f"GPU {src} copies to GPU {dst} at {rate.mean:.0f} GB/s while the pairs' median "
            f"is {typical:.0f} GB/s"
        ),
        evidence={
            "gb_per_s": rate.mean,
            "pairs_median_gb_per_s": typical,
            "min_ratio": PAIR_MIN_RATIO,
        },
        fix="Compare the path between the two with the others' (nvidia-smi topo -m): a pair "
        "across CPU sockets (SYS) or without NVLink is slower; place the ranks that talk most "
        "on the fast pairs, or report inactive links.",
        impact=round(1 - rate.mean / typical, 4),
        subject=f"gpu{src}-gpu{dst}",
    )


def check_figures(result: StressResult) -> list[Finding]:
    """One info finding per GPU with its figures, and the dtypes that were not measured."""
    out = []
    for g in result.gpus:
        parts = []
        for d in datasheet.DTYPES:
            if d in g.tflops:
                share = g.peak_share(d)
                parts.append(f"{d} {g.tflops[d].mean:.0f}" + (f" ({_pct(share)})" if share else ""))
        title = f"GPU {g.index} ({_model(g)}): " + (
            ", ".join(parts) + " TFLOP/s" if parts else "no matmul measured"
        )
        if g.memory_gb_per_s is not None:
            title += f"; memory {g.memory_gb_per_s.mean:.0f} GB/s"
        pinned = g.host_gb_per_s.get("h2d_pinned")
        if pinned is not None:
            title += f"; host to GPU {pinned.mean:.1f} GB/s pinned"
        evidence: dict[str, Any] = {
            "tflops": {d: r.mean for d, r in g.tflops.items()},
            "peak_share": {d: g.peak_share(d) for d in g.tflops},
            "memory_gb_per_s": g.memory_gb_per_s.mean if g.memory_gb_per_s else None,
            "host_gb_per_s": {k: v.mean for k, v in g.host_gb_per_s.items()},
            "not_measured": dict(g.not_measured),
            "datasheet": g.datasheet.source if g.datasheet else None,
        }
        out.append(
            Finding(
                id="stress.figures",
                category=Category.GPU_CAPACITY,
                severity=Severity.INFO,
                title=title,
                evidence=evidence,
                fix="Nothing to do: the figures to compare with later runs "
                "(trainmedic doctor --stress --json).",
                subject=_subject(g),
            )
        )
        if g.datasheet is None:
            out.append(
                Finding(
                    id="stress.no_datasheet",
                    category=Category.GPU_CAPACITY,
                    severity=Severity.INFO,
                    title=f"GPU {g.index} ({g.name}) is not in the datasheet table: its "
                    "figures are judged against the machine's other GPUs only",
                    evidence={"name": g.name},
                    fix="Compare with the model's datasheet by hand; the table is in "
                    "docs/stress.md.",
                    subject=_subject(g),
                )
            )
        skipped = {
            d: why
            for d, why in g.not_measured.items()
            if g.datasheet is not None and d in g.datasheet.tflops
        }
        if skipped:
            out.append(
                Finding(
                    id="stress.dtype_not_measured",
                    category=Category.DRIVER,
                    severity=Severity.INFO,
                    title=(
                        f"GPU {g.index} supports {', '.join(sorted(skipped))} but it was "
                        f"not measured: {next(iter(skipped.values()))}"
                    ),
                    evidence={"not_measured": skipped},
                    fix="Install a torch build that runs these dtypes on this GPU (fp8 "
                    "matmuls need torch 2.1 or newer and CUDA 12.1 or newer).",
                    subject=_subject(g),
                )
            )
    return out


FIGURE_CHECKS: tuple[Check, ...] = (
    check_matmul_datasheet,
    check_matmul_peers,
    check_matmul_together,
    check_memory_bandwidth,
    check_host_link,
    check_peers,
    check_figures,
)


def judge_stress(result: StressResult) -> list[Finding]:
    """Every stress finding, most important first."""
    findings: list[Finding] = []
    for check in (*FIGURE_CHECKS, *HEALTH_CHECKS):
        findings.extend(check(result))
    return rank_findings(findings)


def _same_model(gpus: Sequence[GpuStress]) -> list[list[GpuStress]]:
    groups: dict[str, list[GpuStress]] = {}
    for g in gpus:
        groups.setdefault(g.name, []).append(g)
    return [group for group in groups.values() if len(group) >= 2]


def _median_share(gpus: Sequence[GpuStress], dtype: str) -> float | None:
    shares = [s for g in gpus if (s := g.peak_share(dtype)) is not None]
    return round(median(shares), 4) if shares else None


def _impact(share: float, typical: float) -> float:
    return round(min(1.0, max(0.0, 1 - share / typical)), 4)


def _direction(key: str) -> str:
    return "host to GPU" if key.startswith("h2d") else "GPU to host"


def _slowdown_clause(g: GpuStress) -> str:
    lead = leading_slowdown(g)
    if lead is None:
        return ""
    rule, share = lead
    return f"; {rule.name} active {_pct(share)} of the time"


def _clock_evidence(g: GpuStress) -> dict[str, Any]:
    r = g.readings
    return {
        "sm_clock_mhz": None if r.sm_clock_mhz is None else r.sm_clock_mhz.to_dict(),
        "sm_clock_max_mhz": r.sm_clock_max_mhz,
        "mean_clock_ratio": r.mean_clock_ratio,
        "power_w": None if r.power_w is None else r.power_w.to_dict(),
        "power_limit_w": r.power_limit_w,
        "clock_event_shares": dict(r.reason_shares),
    }


def _capacity_fix(g: GpuStress) -> str:
    lead = leading_slowdown(g)
    if lead is not None:
        return lead[0].fix.replace("<index>", str(g.index))
    return (
        f"Compare the power limit and clocks with the other GPUs (nvidia-smi -i {g.index} -q -d "
        "POWER,CLOCK,PERFORMANCE); reset application clocks (nvidia-smi -rac); if this GPU "
        "stays slow at full clock and cool, report it to the provider or drain it."
    )
