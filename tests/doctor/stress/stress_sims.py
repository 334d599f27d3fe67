"""Simulation files for ``doctor --stress``, built in a test: H100 SXM5 GPUs as healthy as
GPU 0 of examples/simulations/stress/four-h100-faults.json, with the few fields a test
is about changed."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "simulations" / "stress"
_FAULTS = json.loads((EXAMPLES / "four-h100-faults.json").read_text())


def healthy_gpu(index: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """GPU ``index``'s readings (``gpus``) and figures (``stress.gpus``), healthy."""
    gpu = copy.deepcopy(_FAULTS["gpus"][0])
    gpu["uuid"] = f"GPU-{index:08d}-0000-4000-8000-000000000000"
    gpu["pci_bus_id"] = f"0000:{0x18 + 0x20 * index:02x}:00.0"
    return gpu, copy.deepcopy(_FAULTS["stress"]["gpus"][0])


def stress_sim(
    count: int,
    gpus: Mapping[int, Mapping[str, Any]] | None = None,
    figures: Mapping[int, Mapping[str, Any]] | None = None,
    peers: list[list[float | None]] | None = None,
) -> dict[str, Any]:
    """``count`` healthy GPUs; ``gpus[i]`` replaces fields of GPU i's readings (``series``
    among them), ``figures[i]`` fields of its ``stress`` entry; ``peers`` the peer matrix
    (default: 380 GB/s between every two)."""
    readings, stress = [], []
    for i in range(count):
        gpu, fig = healthy_gpu(i)
        gpu.update(copy.deepcopy(dict((gpus or {}).get(i, {}))))
        fig.update(copy.deepcopy(dict((figures or {}).get(i, {}))))
        readings.append(gpu)
        stress.append(fig)
    matrix = peers or [[None if a == b else 380 for b in range(count)] for a in range(count)]
    return {
        "description": "built by a test",
        "driver": copy.deepcopy(_FAULTS["driver"]),
        "gpus": readings,
        "stress": {"gpus": stress, "peer_gb_per_s": matrix},
    }


def write_sim(tmp_path: Path, data: Mapping[str, Any], name: str = "sim.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path
