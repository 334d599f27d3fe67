"""A simulation file as a whole: simulated GPUs plus optional torch and host facts.

The ``gpus``/``driver`` part drives :class:`~trainmedic.gpu.simulated.SimulatedBackend`;
an optional ``torch`` section stands in for the installed torch build and an
optional ``host`` section for the host (fields left out take healthy
defaults), so an example file reproduces the same findings on any machine.
Sections left out are read from this machine. Format: docs/simulation-format.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from trainmedic.errors import SimulationFileError
from trainmedic.framework.torch_build import TorchBuild, torch_build_from_dict
from trainmedic.gpu.simulated import Clock, SimulatedBackend
from trainmedic.gpu.simulation_file import load_simulation_json
from trainmedic.host.simulated import host_facts_from_dict
from trainmedic.host.types import HostFacts

SECTIONS = frozenset({"description", "driver", "gpus", "torch", "host", "stress"})
"""The top-level keys a simulation file may have (``stress`` is read only by
``doctor --stress``: trainmedic.doctor.stress.simulated, docs/stress.md)."""


@dataclass(frozen=True)
class Simulation:
    """What one simulation file provides.

    Attributes:
        torch: the simulated torch build, or ``None`` to read the real one.
        host: the simulated host, or ``None`` to read the real one.
        description: the file's own description, for reports.
    """

    path: str
    backend: SimulatedBackend
    torch: TorchBuild | None
    host: HostFacts | None
    description: str | None


def load_simulation(path: str | Path, clock: Clock = time.monotonic) -> Simulation:
    """Read and validate a simulation file.

    Raises:
        SimulationFileError: naming the file and the offending field.
    """
    source = str(path)
    data = load_simulation_json(path)
    # A misspelt section ("torh") would silently read this machine instead.
    unknown = sorted(set(data) - SECTIONS)
    if unknown:
        raise SimulationFileError(source, unknown[0], "unknown section")
    backend = SimulatedBackend.from_dict(data, source=source, clock=clock)
    torch = torch_build_from_dict(data["torch"], source) if "torch" in data else None
    host = host_facts_from_dict(data["host"], source) if "host" in data else None
    description = data.get("description")
    return Simulation(
        path=source,
        backend=backend,
        torch=torch,
        host=host,
        description=description if isinstance(description, str) else None,
    )
