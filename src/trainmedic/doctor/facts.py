"""Everything doctor's checks look at, gathered once, then judged by pure checks."""

from __future__ import annotations

from dataclasses import dataclass

from trainmedic.framework.torch_build import TorchBuild
from trainmedic.gpu.types import DriverInfo, GpuSample
from trainmedic.host.netprobe import NetworkMeasurement
from trainmedic.host.storage import StorageMeasurement
from trainmedic.host.types import HostFacts


@dataclass(frozen=True)
class GpuFacts:
    """The GPUs as one backend saw them.

    Attributes:
        backend: ``nvml``, ``simulated`` or ``none``.
        absent_reason: why no GPU could be read, else ``None``.
        samples: one reading per GPU, in index order.
        kernel_log: the NVIDIA driver's Xid lines since boot, oldest first;
            ``None`` when the kernel log cannot be read (it usually needs root).
    """

    backend: str
    driver: DriverInfo | None
    samples: tuple[GpuSample, ...]
    absent_reason: str | None = None
    kernel_log: tuple[str, ...] | None = None


@dataclass(frozen=True)
class MachineFacts:
    """The input of every doctor check.

    Attributes:
        torch: ``None`` when torch is not installed.
        storage / network: present only when ``--data-dir`` / ``--data-url`` asked.
    """

    host: HostFacts
    gpu: GpuFacts
    torch: TorchBuild | None
    storage: StorageMeasurement | None = None
    network: NetworkMeasurement | None = None
