"""Reading the GPUs while a burst runs: clocks, power, temperature and the clock event
reasons the GPU shows under load, not after it (a GPU recovers its clock within
milliseconds of going idle, so readings between bursts miss what slowed it).

A :class:`LoadSampler` is started before each burst and stopped after it. On real GPUs
:class:`PeriodicSampler` reads every GPU through the
:class:`~trainmedic.gpu.backend.GpuBackend` from a thread of its own every
:data:`SAMPLE_PERIOD_S` (NVML answers from any thread; the burst's own thread waits in
CUDA calls that release the GIL). The simulated machine has its own sampler on the
simulated clock (:class:`~.simulated.SimulatedSampler`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol

from trainmedic.gpu.backend import GpuBackend
from trainmedic.gpu.types import GpuSample

SAMPLE_PERIOD_S = 0.2
"""Seconds between two readings of the GPUs during a burst: a burst of 0.5 s gets three,
and reading four GPUs through NVML takes a few milliseconds of it."""


class LoadSampler(Protocol):
    """Readings of some GPUs during one burst."""

    def start(self) -> None:
        """Take the first reading now, then one every period until :meth:`stop`."""
        ...

    def stop(self) -> dict[int, list[GpuSample]]:
        """Stop reading; each GPU's readings, oldest first."""
        ...


SamplerFactory = Callable[[Sequence[int]], LoadSampler]
"""A sampler for the GPUs of the given NVML indices."""


class StopSignal(Protocol):
    """What :class:`PeriodicSampler` waits on between readings (a ``threading.Event``)."""

    def wait(self, timeout: float | None = None) -> bool: ...

    def set(self) -> None: ...


class PeriodicSampler:
    """Reads every GPU of ``indices`` through ``backend`` every ``period_s`` seconds from
    a thread of its own, between :meth:`start` and :meth:`stop`.

    ``signal`` makes the stop signal (waiting on it is the thread's only pause), so a
    test can drive the readings without sleeping.
    """

    def __init__(
        self,
        backend: GpuBackend,
        indices: Sequence[int],
        period_s: float = SAMPLE_PERIOD_S,
        signal: Callable[[], StopSignal] = threading.Event,
    ) -> None:
        self._backend = backend
        self._indices = tuple(indices)
        self._period_s = period_s
        self._signal = signal
        self._stop: StopSignal | None = None
        self._thread: threading.Thread | None = None
        self._samples: dict[int, list[GpuSample]] = {i: [] for i in self._indices}
        self._error: BaseException | None = None

    def start(self) -> None:
        self._stop = self._signal()
        self._thread = threading.Thread(
            target=self._loop, args=(self._stop,), name="trainmedic-stress-readings", daemon=True
        )
        self._thread.start()

    def _loop(self, stop: StopSignal) -> None:
        try:
            while True:
                for i in self._indices:
                    self._samples[i].append(self._backend.sample(i))
                if stop.wait(self._period_s):
                    return
        except Exception as exc:  # surfaced by stop(), in the thread that runs the bursts
            self._error = exc

    def stop(self) -> dict[int, list[GpuSample]]:
        if self._stop is not None:
            self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._stop = self._thread = None
        if self._error is not None:
            raise self._error
        out = self._samples
        self._samples = {i: [] for i in self._indices}
        return out


def nvml_sampler(backend: GpuBackend, period_s: float = SAMPLE_PERIOD_S) -> SamplerFactory:
    """Samplers reading ``backend`` from a thread every ``period_s`` seconds."""
    return lambda indices: PeriodicSampler(backend, indices, period_s)
