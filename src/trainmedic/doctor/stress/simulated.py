"""A simulated :class:`~.machine.StressMachine`, driven by a simulation file's ``stress``
section, on a clock the run advances by each burst's length.

The section (docs/stress.md, "Simulation"): per GPU, in the order of the file's ``gpus``,
the matmul TFLOP/s reached at full SM clock per dtype, the dtypes it cannot run and why,
the device copy GB/s, the host copy GB/s, and the byte offsets of memory words that read
back wrong; then ``peer_gb_per_s``, a matrix whose ``null`` off the diagonal means "no
peer access". Matmul rates follow the SM clock the GPU backend reads at the burst's
start, so a series that throttles a GPU slows its compute too. The backend replays the
same file on the same clock, so the readings between bursts are the series' values at
that moment of the run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainmedic.doctor.stress.datasheet import DTYPES
from trainmedic.doctor.stress.machine import (
    MAX_ERROR_OFFSETS,
    MEMTEST_PATTERNS,
    Direction,
    MemtestOutcome,
    Work,
)
from trainmedic.errors import SimulationFileError
from trainmedic.gpu import faults
from trainmedic.gpu.simulated import SimulatedBackend
from trainmedic.gpu.simulation_file import load_simulation_json
from trainmedic.simulation import SECTIONS

HOST_KEYS = ("h2d_pinned", "h2d_pageable", "d2h_pinned", "d2h_pageable")
_GPU_KEYS = frozenset(
    {
        "matmul_tflops",
        "unsupported",
        "device_copy_gb_per_s",
        "host_gb_per_s",
        "memory_error_offsets",
        "follows_sm_clock",
    }
)


class SimulatedClock:
    """A clock that moves only when told: seconds since its start."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def __call__(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += max(0.0, seconds)


@dataclass(frozen=True)
class SimulatedGpu:
    """One GPU's figures in the ``stress`` section (units in the names)."""

    matmul_tflops: Mapping[str, float]
    unsupported: Mapping[str, str] = field(default_factory=dict)
    device_copy_gb_per_s: float = 0.0
    host_gb_per_s: Mapping[str, float] = field(default_factory=dict)
    memory_error_offsets: tuple[int, ...] = ()
    follows_sm_clock: bool = True


class SimulatedStressMachine:
    """GPUs that do exactly what the simulation says, advancing ``clock`` as they work."""

    def __init__(
        self,
        gpus: Sequence[SimulatedGpu],
        peer_gb_per_s: Sequence[Sequence[float | None]],
        backend: SimulatedBackend,
        clock: SimulatedClock,
    ) -> None:
        self._gpus = list(gpus)
        self._peers = [list(row) for row in peer_gb_per_s]
        self._backend = backend
        self._clock = clock
        self.closed = False

    def dtypes(self, index: int) -> dict[str, str | None]:
        g = self._gpus[index]
        out: dict[str, str | None] = {}
        for d in DTYPES:
            if d in g.unsupported:
                out[d] = g.unsupported[d]
            elif d in g.matmul_tflops:
                out[d] = None
        return out

    def _clock_ratio(self, index: int) -> float:
        if not self._gpus[index].follows_sm_clock:
            return 1.0
        ratio = faults.clock_ratio(self._backend.sample(index))
        return 1.0 if ratio is None else min(1.0, ratio)

    def matmul(self, indices: Sequence[int], dtype: str, seconds: float) -> dict[int, Work]:
        rates = {
            i: self._gpus[i].matmul_tflops[dtype] * 1e12 * self._clock_ratio(i) for i in indices
        }
        self._clock.advance(seconds)
        return {i: Work(rate * seconds, seconds) for i, rate in rates.items()}

    def device_copy(self, indices: Sequence[int], seconds: float) -> dict[int, Work]:
        self._clock.advance(seconds)
        return {
            i: Work(self._gpus[i].device_copy_gb_per_s * 1e9 * seconds, seconds) for i in indices
        }

    def memtest(self, index: int, share: float, seconds: float) -> MemtestOutcome:
        free = self._backend.sample(index).memory_free_bytes or 0
        tested = int(free * share) // 4 * 4
        bad = sorted({o for o in self._gpus[index].memory_error_offsets if o < tested})
        # One pass writes and reads every pattern once over the tested memory.
        bandwidth = self._gpus[index].device_copy_gb_per_s * 1e9
        per_pass = tested * len(MEMTEST_PATTERNS) / bandwidth if bandwidth > 0 else seconds
        passes = max(1, math.floor(seconds / per_pass)) if per_pass > 0 else 1
        self._clock.advance(seconds)
        return MemtestOutcome(
            tested_bytes=tested,
            share_of_free=round(tested / free, 4) if free else 0.0,
            patterns=MEMTEST_PATTERNS,
            passes=passes,
            errors=len(bad) * passes,
            error_offsets=tuple(bad[:MAX_ERROR_OFFSETS]),
            seconds=seconds,
        )

    def host_copy(self, index: int, direction: Direction, pinned: bool, seconds: float) -> Work:
        key = f"{direction}_{'pinned' if pinned else 'pageable'}"
        self._clock.advance(seconds)
        return Work(self._gpus[index].host_gb_per_s.get(key, 0.0) * 1e9 * seconds, seconds)

    def peer_copy(self, src: int, dst: int, seconds: float) -> Work | None:
        rate = self._peers[src][dst] if src < len(self._peers) else None
        if rate is None:
            return None
        self._clock.advance(seconds)
        return Work(rate * 1e9 * seconds, seconds)

    def close(self) -> None:
        self.closed = True


@dataclass(frozen=True)
class StressSimulation:
    """A simulation file read for ``doctor --stress``: the GPU backend and the compute,
    both on ``clock``."""

    path: str
    backend: SimulatedBackend
    machine: SimulatedStressMachine
    clock: SimulatedClock
    description: str | None


def load_stress_simulation(
    path: str | Path, clock: SimulatedClock | None = None
) -> StressSimulation:
    """Read a simulation file with a ``stress`` section.

    Raises:
        SimulationFileError: the file, or its ``stress`` section, is malformed or missing.
    """
    source = str(path)
    data = load_simulation_json(path)
    unknown = sorted(set(data) - SECTIONS)
    if unknown:
        raise SimulationFileError(source, unknown[0], "unknown section")
    if "stress" not in data:
        raise SimulationFileError(
            source,
            "stress",
            "missing: doctor --stress needs the GPUs' figures under load (docs/stress.md)",
        )
    clock = clock or SimulatedClock()
    backend = SimulatedBackend.from_dict(data, source=source, clock=clock)
    gpus, peers = parse_stress_section(data["stress"], source, backend.device_count())
    description = data.get("description")
    return StressSimulation(
        path=source,
        backend=backend,
        machine=SimulatedStressMachine(gpus, peers, backend, clock),
        clock=clock,
        description=description if isinstance(description, str) else None,
    )


def parse_stress_section(
    section: Any, source: str, gpu_count: int
) -> tuple[list[SimulatedGpu], list[list[float | None]]]:
    """The ``stress`` section, validated; errors name the file and the field."""
    if not isinstance(section, dict):
        raise SimulationFileError(source, "stress", "expected an object")
    unknown = sorted(set(section) - {"gpus", "peer_gb_per_s"})
    if unknown:
        raise SimulationFileError(source, f"stress.{unknown[0]}", "unknown field")
    raw = section.get("gpus")
    if not isinstance(raw, list) or len(raw) != gpu_count:
        raise SimulationFileError(
            source, "stress.gpus", f"expected a list of {gpu_count} GPU(s), as in gpus"
        )
    gpus = [_gpu(g, source, f"stress.gpus[{n}]") for n, g in enumerate(raw)]
    peers = _peers(section.get("peer_gb_per_s"), source, gpu_count)
    return gpus, peers


def _number(value: Any, source: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise SimulationFileError(source, where, "expected a finite number")
    if value < 0:
        raise SimulationFileError(source, where, "must not be negative")
    return float(value)


def _rates(value: Any, keys: Sequence[str], source: str, where: str) -> dict[str, float]:
    if not isinstance(value, dict):
        raise SimulationFileError(source, where, "expected an object")
    out = {}
    for k, v in value.items():
        if k not in keys:
            raise SimulationFileError(source, f"{where}.{k}", f"expected one of {', '.join(keys)}")
        out[k] = _number(v, source, f"{where}.{k}")
    return out


def _gpu(raw: Any, source: str, where: str) -> SimulatedGpu:
    if not isinstance(raw, dict):
        raise SimulationFileError(source, where, "expected an object")
    unknown = sorted(set(raw) - _GPU_KEYS)
    if unknown:
        raise SimulationFileError(source, f"{where}.{unknown[0]}", "unknown field")
    unsupported = raw.get("unsupported", {})
    if not isinstance(unsupported, dict) or not all(
        k in DTYPES and isinstance(v, str) for k, v in unsupported.items()
    ):
        expected = "expected {dtype: why} with dtypes of " + ", ".join(DTYPES)
        raise SimulationFileError(source, f"{where}.unsupported", expected)
    offsets = raw.get("memory_error_offsets", [])
    if not isinstance(offsets, list) or not all(
        isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets
    ):
        raise SimulationFileError(
            source, f"{where}.memory_error_offsets", "expected a list of byte offsets"
        )
    follows = raw.get("follows_sm_clock", True)
    if not isinstance(follows, bool):
        raise SimulationFileError(source, f"{where}.follows_sm_clock", "expected true or false")
    return SimulatedGpu(
        matmul_tflops=_rates(
            raw.get("matmul_tflops", {}), DTYPES, source, f"{where}.matmul_tflops"
        ),
        unsupported=dict(unsupported),
        device_copy_gb_per_s=_number(
            raw.get("device_copy_gb_per_s", 0), source, f"{where}.device_copy_gb_per_s"
        ),
        host_gb_per_s=_rates(
            raw.get("host_gb_per_s", {}), HOST_KEYS, source, f"{where}.host_gb_per_s"
        ),
        memory_error_offsets=tuple(offsets),
        follows_sm_clock=follows,
    )


def _peers(raw: Any, source: str, n: int) -> list[list[float | None]]:
    where = "stress.peer_gb_per_s"
    if raw is None:
        return [[None] * n for _ in range(n)]
    if (
        not isinstance(raw, list)
        or len(raw) != n
        or not all(isinstance(row, list) and len(row) == n for row in raw)
    ):
        raise SimulationFileError(source, where, f"expected a {n} x {n} matrix")
    return [
        [None if v is None else _number(v, source, f"{where}[{a}][{b}]") for b, v in enumerate(row)]
        for a, row in enumerate(raw)
    ]
