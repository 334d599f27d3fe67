"""Gather the facts doctor judges: GPUs, torch, host, and optionally data paths.

The only part of doctor that does I/O; every source is a seam so tests and
``--simulate`` can stand in for the machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmedic.doctor.facts import GpuFacts, MachineFacts
from trainmedic.framework.torch_build import TorchBuild, read_torch_build
from trainmedic.gpu.backend import GpuBackend, sample_all
from trainmedic.gpu.factory import open_nvml_or_none
from trainmedic.gpu.simulated import SimulatedBackend
from trainmedic.host.gather import gather_host_facts
from trainmedic.host.kernel_log import read_driver_lines
from trainmedic.host.netprobe import measure_network
from trainmedic.host.storage import measure_storage
from trainmedic.simulation import Simulation, load_simulation


@dataclass(frozen=True)
class DoctorRequest:
    """What the user asked doctor to look at.

    Attributes:
        simulate: path of a simulation file, or ``None`` for the real machine.
        data_dir: directory of training data to measure reads from.
        data_url: URL or host:port the data is fetched from.
        io_budget_s: time budget of the storage measurement, seconds.
        net_budget_s: time budget of the network measurement, seconds.
    """

    simulate: str | None = None
    data_dir: str | None = None
    data_url: str | None = None
    io_budget_s: float = 10.0
    net_budget_s: float = 10.0


def gpu_facts(backend: GpuBackend) -> GpuFacts:
    """One reading of every GPU the backend sees, and the driver's Xids since boot."""
    samples = tuple(sample_all(backend))
    kernel_log: tuple[str, ...] | None = None
    if isinstance(backend, SimulatedBackend):
        kernel_log = backend.kernel_log()
    elif samples:
        kernel_log = read_driver_lines()
    return GpuFacts(
        backend=backend.kind,
        driver=backend.driver(),
        samples=samples,
        absent_reason=backend.absent_reason,
        kernel_log=kernel_log,
    )


def gather_facts(request: DoctorRequest) -> MachineFacts:
    """Read the machine (or the simulation) as the request says."""
    simulation: Simulation | None = None
    if request.simulate is not None:
        simulation = load_simulation(request.simulate)
        backend: GpuBackend = simulation.backend
    else:
        backend = open_nvml_or_none()
    try:
        gpus = gpu_facts(backend)
    finally:
        backend.close()
    torch: TorchBuild | None
    if simulation is not None and simulation.torch is not None:
        torch = simulation.torch
    else:
        # Importing torch costs seconds; it is only worth it when GPUs exist.
        torch = read_torch_build(import_torch=bool(gpus.samples))
    host = simulation.host if simulation is not None and simulation.host else gather_host_facts()
    storage = (
        measure_storage(request.data_dir, budget_s=request.io_budget_s)
        if request.data_dir is not None
        else None
    )
    network = (
        measure_network(request.data_url, budget_s=request.net_budget_s)
        if request.data_url is not None
        else None
    )
    return MachineFacts(host=host, gpu=gpus, torch=torch, storage=storage, network=network)
