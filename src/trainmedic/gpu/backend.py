"""The GPU backend seam: one interface, NVML or simulated behind it.

Callers ask :func:`trainmedic.gpu.factory.open_backend` for a backend and read
typed :class:`~trainmedic.gpu.types.GpuSample` objects from it; nothing above
this package imports NVML. This module holds only the interface (and the
backend of a machine without GPUs): the backends import it, never the reverse.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from trainmedic.gpu.types import DriverInfo, GpuSample


@dataclass(frozen=True)
class XidNotice:
    """An Xid the driver reported while it was watched.

    Attributes:
        code: the Xid.
        gpu_index: NVML index of the GPU, when the source names it.
        line: the kernel log line, when the source is the log (it names the
            PCI bus, the process and the details), else ``None``.
        gpu_instance: MIG GPU instance, when known.
    """

    code: int
    gpu_index: int | None = None
    line: str | None = None
    gpu_instance: int | None = None


class XidWatch(Protocol):
    """Xids as they happen, from the driver."""

    def wait(self, timeout_s: float) -> list[XidNotice]:
        """Xids reported since the last call, waiting up to ``timeout_s`` for one."""
        ...

    def close(self) -> None: ...


class GpuBackend(Protocol):
    """Source of GPU readings.

    ``driver()`` returns ``None`` when no NVIDIA driver is present; then
    ``device_count()`` is 0 and ``absent_reason`` says why.
    """

    @property
    def kind(self) -> str:
        """``"nvml"``, ``"simulated"`` or ``"none"``."""
        ...

    @property
    def absent_reason(self) -> str | None:
        """Why no GPU can be read (no driver, NVML library missing), else ``None``."""
        ...

    def driver(self) -> DriverInfo | None: ...

    def device_count(self) -> int: ...

    def sample(self, index: int) -> GpuSample:
        """Read GPU ``index`` now. Unsupported readings come back as ``None``."""
        ...

    def xid_watch(self) -> XidWatch | None:
        """The driver's Xid events from now on, or ``None`` when they cannot be had."""
        ...

    def close(self) -> None: ...


class NoGpuBackend:
    """The backend of a machine where no NVIDIA GPU can be read."""

    def __init__(self, reason: str) -> None:
        self._reason = reason

    @property
    def kind(self) -> str:
        return "none"

    @property
    def absent_reason(self) -> str | None:
        return self._reason

    def driver(self) -> DriverInfo | None:
        return None

    def device_count(self) -> int:
        return 0

    def sample(self, index: int) -> GpuSample:
        raise IndexError(f"no GPU {index}: {self._reason}")

    def xid_watch(self) -> XidWatch | None:
        return None

    def close(self) -> None:
        return None


def sample_all(backend: GpuBackend) -> list[GpuSample]:
    """One reading of every GPU the backend sees."""
    return [backend.sample(i) for i in range(backend.device_count())]
