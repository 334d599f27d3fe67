"""A simulated :class:`~.machine.StressMachine`, driven by a simulation file's ``stress``
section, on a clock the run advances by each burst's length.

The section (docs/stress.md, "Simulation"): per GPU, in the order of the file's ``gpus``,
the matmul TFLOP/s reached at full SM clock per dtype (and the share of it reached when
every selected GPU runs at once), the dtypes it cannot run and why, the device copy GB/s,
the host copy GB/s, and the byte offsets of memory words that read back wrong; then
``peer_gb_per_s``, a matrix whose ``null`` off the diagonal means "no peer access".
A burst computes in steps of :data:`SIM_STEP_S`, each at the SM clock the GPU backend
gives at its start, so a series that throttles a GPU, even halfway through a burst,
slows its compute too. The backend replays the same file on the same clock, and
:class:`SimulatedSampler` reads it every :data:`~.sampling.SAMPLE_PERIOD_S` while a burst
advances the clock: the readings during a burst are the series' values at those moments.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
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
from trainmedic.doctor.stress.sampling import SAMPLE_PERIOD_S
from trainmedic.errors import SimulationFileError
from trainmedic.gpu import faults
from trainmedic.gpu.simulated import SimulatedBackend
from trainmedic.gpu.simulation_file import load_simulation_json
from trainmedic.gpu.types import GpuSample
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
        "matmul_together_share",
    }
)


class SimulatedClock:
    """A clock that moves only when told: seconds since its start.

    Timers (:meth:`every`) fire at each multiple of their period while :meth:`advance`
    moves the clock past it, with the clock set to that moment: what a thread reading
    the GPUs every period during a burst would see.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        # handle -> [first due time, period, firings so far, callback]
        self._timers: dict[int, tuple[float, float, list[int], Callable[[], None]]] = {}
        self._next_handle = 0

    def __call__(self) -> float:
        return self._now

    def every(self, period_s: float, callback: Callable[[], None]) -> int:
        """Call ``callback`` every ``period_s`` seconds from now on; returns a handle."""
        if period_s <= 0:
            raise ValueError(f"a timer's period must be positive, not {period_s}")
        handle = self._next_handle
        self._next_handle += 1
        self._timers[handle] = (self._now, period_s, [0], callback)
        return handle

    def cancel(self, handle: int) -> None:
        self._timers.pop(handle, None)

    def _due(self, handle: int) -> float:
        start, period, fired, _ = self._timers[handle]
        # From the start each time, so that many periods add no rounding drift.
        return start + (fired[0] + 1) * period

    def advance(self, seconds: float) -> None:
        target = self._now + max(0.0, seconds)
        while self._timers:
            handle = min(self._timers, key=self._due)
            due = self._due(handle)
            if due >= target - _TIE_S:
                break
            self._now = due
            self._timers[handle][2][0] += 1
            self._timers[handle][3]()
        self._now = target


_TIE_S = 1e-9
"""A timer due this close to the end of an advance fires with the next one (as a reading
thread woken at the very end of a burst reads after it)."""

SIM_STEP_S = 0.05
"""The simulated machine computes in steps of this length, each at the SM clock the GPU
backend gives at its start: a clock that falls during a burst slows the rest of it."""


class SimulatedSampler:
    """Reads the simulated GPUs at the start of a burst and every ``period_s`` of the
    simulated clock while the burst advances it (:class:`~.sampling.LoadSampler`)."""

    def __init__(
        self,
        backend: SimulatedBackend,
        indices: Sequence[int],
        clock: SimulatedClock,
        period_s: float = SAMPLE_PERIOD_S,
    ) -> None:
        self._backend = backend
        self._indices = tuple(indices)
        self._clock = clock
        self._period_s = period_s
        self._handle: int | None = None
        self._samples: dict[int, list[GpuSample]] = {i: [] for i in self._indices}

    def _read(self) -> None:
        for i in self._indices:
            self._samples[i].append(self._backend.sample(i))

    def start(self) -> None:
        self._read()
        self._handle = self._clock.every(self._period_s, self._read)

    def stop(self) -> dict[int, list[GpuSample]]:
        if self._handle is not None:
            self._clock.cancel(self._handle)
            self._handle = None
        out = self._samples
        self._samples = {i: [] for i in self._indices}
        return out


@dataclass(frozen=True)
class SimulatedGpu:
    """One GPU's figures in the ``stress`` section (units in the names)."""

    matmul_tflops: Mapping[str, float]
    unsupported: Mapping[str, str] = field(default_factory=dict)
    device_copy_gb_per_s: float = 0.0
    host_gb_per_s: Mapping[str, float] = field(default_factory=dict)
    memory_error_offsets: tuple[int, ...] = ()
    follows_sm_clock: bool = True
    matmul_together_share: float = 1.0


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

    def _work(self, seconds: float, rates: Callable[[], Mapping[int, float]]) -> dict[int, Work]:
        """Run for ``seconds`` in steps of :data:`SIM_STEP_S`, each at the ``rates`` (per
        second, per GPU) of its start; the clock moves with the steps."""
        done: dict[int, float] = {}
        left = seconds
        while left > _TIE_S:
            step = min(SIM_STEP_S, left)
            for i, rate in rates().items():
                done[i] = done.get(i, 0.0) + rate * step
            self._clock.advance(step)
            left -= step
        return {i: Work(amount, seconds) for i, amount in done.items()}

    def matmul(self, indices: Sequence[int], dtype: str, seconds: float) -> dict[int, Work]:
        # A machine that cannot feed every GPU at once (power, cooling) slows each of them
        # by its together share only when they run together.
        together = len(indices) > 1
        return self._work(
            seconds,
            lambda: {
                i: self._gpus[i].matmul_tflops[dtype]
                * 1e12
                * self._clock_ratio(i)
                * (self._gpus[i].matmul_together_share if together else 1.0)
                for i in indices
            },
        )

    def device_copy(self, indices: Sequence[int], seconds: float) -> dict[int, Work]:
        return self._work(
            seconds, lambda: {i: self._gpus[i].device_copy_gb_per_s * 1e9 for i in indices}
        )

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
        rate = self._gpus[index].host_gb_per_s.get(key, 0.0) * 1e9
        return self._work(seconds, lambda: {index: rate})[index]

    def peer_copy(self, src: int, dst: int, seconds: float) -> Work | None:
        rate = self._peers[src][dst] if src < len(self._peers) else None
        if rate is None:
            return None
        return self._work(seconds, lambda: {src: rate * 1e9})[src]

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

    def sampler(self, indices: Sequence[int]) -> SimulatedSampler:
        """A sampler of the GPUs ``indices`` during a burst, on the simulation's clock."""
        return SimulatedSampler(self.backend, indices, self.clock)


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
    together = _number(
        raw.get("matmul_together_share", 1.0), source, f"{where}.matmul_together_share"
    )
    if not 0 < together <= 1:
        raise SimulationFileError(
            source, f"{where}.matmul_together_share", "expected a share over 0, at most 1"
        )
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
        matmul_together_share=together,
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
