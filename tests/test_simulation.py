"""A simulation file as a whole: GPUs plus optional torch and host sections."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainmedic.errors import SimulationFileError
from trainmedic.framework.torch_build import TorchBuild
from trainmedic.simulation import load_simulation

NO_GPU: dict[str, Any] = {"driver": None, "gpus": []}


def write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "sim.json"
    path.write_text(json.dumps(doc))
    return path


def test_sections_left_out_are_none(tmp_path: Path) -> None:
    simulation = load_simulation(write(tmp_path, NO_GPU))
    assert (simulation.torch, simulation.host, simulation.description) == (None, None, None)
    assert simulation.backend.device_count() == 0


def test_all_sections_are_read(tmp_path: Path) -> None:
    doc = NO_GPU | {
        "description": "a CPU box",
        "torch": {"version": "2.4.0+cpu", "cuda_version": None},
        "host": {"user": "ann"},
    }
    simulation = load_simulation(write(tmp_path, doc))
    assert simulation.description == "a CPU box"
    assert simulation.torch == TorchBuild(version="2.4.0+cpu", cuda_version=None)
    assert simulation.host is not None and simulation.host.user == "ann"


@pytest.mark.parametrize("section", ["torh", "gpu", "hosts"])
def test_misspelt_section_is_an_error(tmp_path: Path, section: str) -> None:
    path = write(tmp_path, NO_GPU | {section: {}})
    with pytest.raises(SimulationFileError) as info:
        load_simulation(path)
    assert str(info.value) == f"simulation file {path}: {section}: unknown section"
