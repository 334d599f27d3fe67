"""Which GPU backend to use: NVML when the driver is there, a simulation when asked.

The backends (:mod:`trainmedic.gpu.nvml`, :mod:`trainmedic.gpu.simulated`)
implement :class:`~trainmedic.gpu.backend.GpuBackend`; this module chooses and
opens one, so the interface module imports no backend.
"""

from __future__ import annotations

from trainmedic.gpu.backend import GpuBackend


def open_backend(simulate: str | None = None) -> GpuBackend:
    """NVML when available, the simulated backend when ``simulate`` names a file.

    Never raises for a missing driver: that yields a
    :class:`~trainmedic.gpu.backend.NoGpuBackend`.
    Raises :class:`~trainmedic.errors.SimulationFileError` for a bad file.
    """
    if simulate is not None:
        from trainmedic.gpu.simulated import SimulatedBackend

        return SimulatedBackend.from_file(simulate)
    return open_nvml_or_none()


def open_nvml_or_none() -> GpuBackend:
    """The NVML backend, or a :class:`~trainmedic.gpu.backend.NoGpuBackend` saying why
    there is none."""
    from trainmedic.gpu.nvml import open_nvml

    return open_nvml()
