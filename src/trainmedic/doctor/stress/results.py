"""What a stress run measured: typed, frozen, with units in the names.

Built by :mod:`.runner`, judged by :mod:`.judge`, shown by :mod:`trainmedic.report.stress`
and written into the findings document's ``context["stress"]`` by
:meth:`StressResult.to_dict`.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainmedic.doctor.stress.datasheet import Datasheet
from trainmedic.doctor.stress.dcgm import DcgmOutcome
from trainmedic.doctor.stress.machine import MemtestOutcome
from trainmedic.gpu.types import EccCounts, PcieLink, RemappedRows

TERA = 1e12
GIGA = 1e9


@dataclass(frozen=True)
class Rate:
    """A rate over a measurement's bursts.

    Attributes:
        mean: total amount over total seconds (TFLOP/s or GB/s, as the field names).
        first / last: the first and the last burst's own rate: how far it fell.
        bursts: how many bursts it spans.
    """

    mean: float
    first: float
    last: float
    bursts: int

    @classmethod
    def of(cls, rates: Sequence[float], amounts: float, seconds: float, unit: float) -> Rate:
        mean = amounts / seconds / unit if seconds > 0 else 0.0
        return cls(
            round(mean, 3), round(rates[0] / unit, 3), round(rates[-1] / unit, 3), len(rates)
        )

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "first": self.first, "last": self.last, "bursts": self.bursts}


@dataclass(frozen=True)
class Drift:
    """A reading through the load: its first and last value, lowest and highest."""

    start: float
    end: float
    low: float
    high: float

    @property
    def change(self) -> float | None:
        """``end`` relative to ``start`` (``-0.29``: fell by 29 %); ``None`` from 0."""
        return None if self.start == 0 else round((self.end - self.start) / self.start, 4)

    @classmethod
    def of(cls, values: Sequence[float | None]) -> Drift | None:
        known = [v for v in values if v is not None]
        if not known:
            return None
        return cls(known[0], known[-1], min(known), max(known))

    def to_dict(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "low": self.low,
            "high": self.high,
            "change": self.change,
        }


@dataclass(frozen=True)
class LoadReadings:
    """What the GPU backend read from one GPU during the bursts.

    Attributes:
        samples: readings taken, all while a burst ran.
        sample_period_s: seconds between two readings during a burst (``None``: not stated).
        sm_clock_mhz / power_w / temperature_c: through the load.
        sm_clock_max_mhz / power_limit_w / temperature_slowdown_c: the limits, as read.
        mean_clock_ratio: mean SM clock over its maximum, 0..1.
        reason_shares: for each slowdown reason (:data:`trainmedic.gpu.faults.CLOCK_RULES`
            keys) the share of readings in which it counted, 0..1.
        link_gen_under_load / link_width_under_load: the highest PCIe generation and width
            read during the host copies (an idle link trains down to save power).
    """

    samples: int
    sm_clock_mhz: Drift | None
    power_w: Drift | None
    temperature_c: Drift | None
    sm_clock_max_mhz: float | None
    power_limit_w: float | None
    temperature_slowdown_c: float | None
    mean_clock_ratio: float | None
    reason_shares: Mapping[str, float]
    link_gen_under_load: int | None = None
    link_width_under_load: int | None = None
    sample_period_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        def d(x: Drift | None) -> dict[str, Any] | None:
            return None if x is None else x.to_dict()

        return {
            "samples": self.samples,
            "sample_period_s": self.sample_period_s,
            "sm_clock_mhz": d(self.sm_clock_mhz),
            "power_w": d(self.power_w),
            "temperature_c": d(self.temperature_c),
            "sm_clock_max_mhz": self.sm_clock_max_mhz,
            "power_limit_w": self.power_limit_w,
            "temperature_slowdown_c": self.temperature_slowdown_c,
            "mean_clock_ratio": self.mean_clock_ratio,
            "reason_shares": dict(self.reason_shares),
            "link_gen_under_load": self.link_gen_under_load,
            "link_width_under_load": self.link_width_under_load,
        }


@dataclass(frozen=True)
class GpuStress:
    """Everything measured on one GPU.

    Attributes:
        datasheet: its table entry, ``None`` for a model not in the table.
        tflops: dense matmul TFLOP/s per dtype measured.
        not_measured: dtypes not run on it, and why.
        memory_gb_per_s: device-to-device copy bandwidth, GB/s (read plus written).
        memtest: the memory test, ``None`` when it did not run.
        host_gb_per_s: ``h2d_pinned``, ``h2d_pageable``, ``d2h_pinned``, ``d2h_pageable``.
        link: the PCIe link as read before the load (its maximum generation and width).
        ecc_before / ecc_after, rows_before / rows_after: the error counters around the run.
        tflops_alone: dense matmul TFLOP/s with this GPU running alone, in its best dtype
            (empty with one GPU selected: its ``tflops`` were alone already).
    """

    index: int
    name: str
    uuid: str | None
    datasheet: Datasheet | None
    tflops: Mapping[str, Rate]
    not_measured: Mapping[str, str]
    memory_gb_per_s: Rate | None
    memtest: MemtestOutcome | None
    host_gb_per_s: Mapping[str, Rate]
    link: PcieLink
    readings: LoadReadings
    ecc_before: EccCounts = field(default_factory=EccCounts)
    ecc_after: EccCounts = field(default_factory=EccCounts)
    rows_before: RemappedRows = field(default_factory=RemappedRows)
    rows_after: RemappedRows = field(default_factory=RemappedRows)
    tflops_alone: Mapping[str, Rate] = field(default_factory=dict)

    def together_share(self, dtype: str) -> float | None:
        """TFLOP/s with every GPU running over TFLOP/s alone in ``dtype``: 1 when running
        together costs nothing, 0.7 when it costs 30 %."""
        alone, together = self.tflops_alone.get(dtype), self.tflops.get(dtype)
        if alone is None or together is None or alone.mean <= 0:
            return None
        return round(together.mean / alone.mean, 4)

    def peak_share(self, dtype: str) -> float | None:
        """Measured TFLOP/s over the datasheet's peak in ``dtype``, 0..1+."""
        peak = self.datasheet.tflops.get(dtype) if self.datasheet else None
        rate = self.tflops.get(dtype)
        return None if not peak or rate is None else round(rate.mean / peak, 4)

    def to_dict(self) -> dict[str, Any]:
        memtest = self.memtest
        return {
            "index": self.index,
            "name": self.name,
            "uuid": self.uuid,
            "datasheet": None if self.datasheet is None else self.datasheet.to_dict(),
            "tflops": {k: v.to_dict() for k, v in self.tflops.items()},
            "peak_share": {k: self.peak_share(k) for k in self.tflops},
            "tflops_alone": {k: v.to_dict() for k, v in self.tflops_alone.items()},
            "together_share": {k: self.together_share(k) for k in self.tflops_alone},
            "not_measured": dict(self.not_measured),
            "memory_gb_per_s": None
            if self.memory_gb_per_s is None
            else self.memory_gb_per_s.to_dict(),
            "memtest": None
            if memtest is None
            else {
                "tested_bytes": memtest.tested_bytes,
                "share_of_free": memtest.share_of_free,
                "patterns": list(memtest.patterns),
                "passes": memtest.passes,
                "errors": memtest.errors,
                "error_offsets": list(memtest.error_offsets),
                "seconds": memtest.seconds,
            },
            "host_gb_per_s": {k: v.to_dict() for k, v in self.host_gb_per_s.items()},
            "pcie_gen_max": self.link.gen_max,
            "pcie_width_max": self.link.width_max,
            "readings": self.readings.to_dict(),
            "ecc_before": vars(self.ecc_before),
            "ecc_after": vars(self.ecc_after),
            "remapped_rows_before": vars(self.rows_before),
            "remapped_rows_after": vars(self.rows_after),
        }


@dataclass(frozen=True)
class PeerStress:
    """Copies from GPU ``src`` to GPU ``dst``: GB/s, ``None`` without peer access."""

    src: int
    dst: int
    gb_per_s: Rate | None

    def to_dict(self) -> dict[str, Any]:
        rate = None if self.gb_per_s is None else self.gb_per_s.to_dict()
        return {"src": self.src, "dst": self.dst, "gb_per_s": rate}


@dataclass(frozen=True)
class StressResult:
    """One stress run over some GPUs.

    Attributes:
        seconds: the per-GPU budget asked for, seconds.
        elapsed_s: how long the bursts took in all, seconds.
        backend: the GPU backend read (``nvml``, ``simulated``).
        machine: which compute ran (``torch.cuda``, ``simulated``).
        dcgm: ``dcgmi diag``'s outcome, ``None`` when not asked for.
    """

    seconds: float
    elapsed_s: float
    backend: str
    machine: str
    gpus: tuple[GpuStress, ...]
    peers: tuple[PeerStress, ...] = ()
    dcgm: DcgmOutcome | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "elapsed_s": round(self.elapsed_s, 3),
            "backend": self.backend,
            "machine": self.machine,
            "gpus": [g.to_dict() for g in self.gpus],
            "peers": [p.to_dict() for p in self.peers],
            "dcgm": None if self.dcgm is None else self.dcgm.to_dict(),
        }


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (which must not be empty)."""
    return float(statistics.median(values))
