"""A simulated GPU backend driven by a JSON file (docs/simulation-format.md).

The file describes one or more GPUs with the readings NVML gives, optionally
as a time series: each GPU's ``series`` is a list of ``{"t": seconds, ...}``
entries whose fields override the GPU's base readings from second ``t`` on
(applied cumulatively, in order). Time counts from the backend's creation on
the injected clock, so a whole run can be replayed. The file is read and
validated by :mod:`trainmedic.gpu.simulation_file`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from trainmedic.gpu.backend import XidNotice, XidWatch
from trainmedic.gpu.faults import parse_xid_line
from trainmedic.gpu.simulation_file import apply_overrides, load_simulation_json, parse_document
from trainmedic.gpu.types import DriverInfo, GpuSample

Clock = Callable[[], float]


class SimulatedBackend:
    """GPU readings replayed from a simulation file."""

    def __init__(
        self,
        driver: DriverInfo | None,
        gpus: Sequence[GpuSample],
        series: Sequence[Sequence[tuple[float, Mapping[str, Any]]]],
        clock: Clock = time.monotonic,
        source: str = "<memory>",
        kernel_log: Sequence[Sequence[tuple[float, str]]] = (),
    ) -> None:
        self._driver = driver
        # (seconds, GPU index, driver line), in time order.
        self._kernel_log = sorted(
            (t, i, line) for i, lines in enumerate(kernel_log) for t, line in lines
        )
        self._gpus = list(gpus)
        self._series = [list(s) for s in series] + [[] for _ in range(len(gpus) - len(series))]
        self._clock = clock
        self._start = clock()
        # Samples carry wall-clock timestamps like NVML's, advancing with the
        # injected clock so a replay is deterministic.
        self._wall_start = time.time()
        self.source = source

    @classmethod
    def from_file(cls, path: str | Path, clock: Clock = time.monotonic) -> SimulatedBackend:
        data = load_simulation_json(path)
        return cls.from_dict(data, source=str(path), clock=clock)

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], source: str = "<memory>", clock: Clock = time.monotonic
    ) -> SimulatedBackend:
        driver, gpus, series, logs = parse_document(data, source)
        return cls(driver, gpus, series, clock=clock, source=source, kernel_log=logs)

    @property
    def kind(self) -> str:
        return "simulated"

    @property
    def absent_reason(self) -> str | None:
        if self._driver is None:
            return f"no NVIDIA driver (simulated by {self.source})"
        return None

    @property
    def duration_s(self) -> float:
        """Time of the last series entry over all GPUs (0 without a series)."""
        return max((t for s in self._series for t, _ in s), default=0.0)

    def driver(self) -> DriverInfo | None:
        return self._driver

    def device_count(self) -> int:
        return len(self._gpus)

    def sample(self, index: int) -> GpuSample:
        if not 0 <= index < len(self._gpus):
            raise IndexError(f"no GPU {index} in {self.source}")
        elapsed = self._clock() - self._start
        gpu = self._gpus[index]
        for t, overrides in self._series[index]:
            if t > elapsed:
                break
            gpu = apply_overrides(gpu, overrides)
        return replace(gpu, timestamp=self._wall_start + elapsed)

    def kernel_log(self) -> tuple[str, ...]:
        """Every driver line of the simulated kernel log (doctor reads "since boot")."""
        return tuple(line for _, _, line in self._kernel_log)

    def xid_watch(self) -> XidWatch | None:
        """The simulated kernel log's lines as they fall due on the backend's clock."""
        if not self._kernel_log:
            return None
        return _SimulatedXidWatch(self)

    def _due(self, after: int) -> tuple[int, list[XidNotice]]:
        elapsed = self._clock() - self._start
        out: list[XidNotice] = []
        n = after
        while n < len(self._kernel_log) and self._kernel_log[n][0] <= elapsed:
            t, index, line = self._kernel_log[n]
            event = parse_xid_line(line)
            if event is not None and t >= 0:  # lines from before the start are history
                out.append(XidNotice(event.code, index, line, event.gpu_instance))
            n += 1
        return n, out

    def close(self) -> None:
        return None


class _SimulatedXidWatch:
    def __init__(self, backend: SimulatedBackend) -> None:
        self._backend = backend
        self._next = 0

    def wait(self, timeout_s: float) -> list[XidNotice]:
        self._next, due = self._backend._due(self._next)
        return due

    def close(self) -> None:
        return None
