"""GpuSample's fields are described once (trainmedic.gpu.fields), and the record codec
and the simulation file derived from that description carry every one of them."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from trainmedic.gpu import fields as gf
from trainmedic.gpu.simulation_file import parse_document
from trainmedic.gpu.types import (
    EccCounts,
    GpuProcess,
    GpuSample,
    MigDevice,
    PcieLink,
    RemappedRows,
)
from trainmedic.record.gpu_codec import GPU_KEYS, GpuSampleDecoder, GpuSampleEncoder


def _value(kind: gf.Kind, n: int) -> Any:
    """A value of ``kind`` that differs with ``n`` (never a default)."""
    return {"text": f"v{n}", "int": 10 + n, "float": 20.5 + n, "bool": n % 2 == 0}[kind]


def _group_value(group: gf.Group, n: int) -> Any:
    values = [_value(kind, n + k) for k, (_, kind) in enumerate(group.members)]
    return dict(zip(group.member_names, values, strict=True))


def _sample(n: int) -> GpuSample:
    """A sample in which every field holds a value of its kind, all shifted by ``n``."""
    scalars = {f.name: _value(f.kind, n + k) for k, f in enumerate(gf.SCALARS)}
    scalars["pci_bus_id"] = f"0000:{n % 256:02x}:00.0"
    scalars["memory_used_bytes"] = 5 + n  # below the total
    return GpuSample(
        timestamp=100.0 + n,
        index=0,
        **scalars,
        ecc=EccCounts(**_group_value(gf.ECC, n)),
        remapped_rows=RemappedRows(**_group_value(gf.REMAPPED_ROWS, n)),
        pcie=PcieLink(**_group_value(gf.PCIE_LINK, n), **_group_value(gf.PCIE_TRAFFIC, n + 7)),
        processes=(GpuProcess(**_group_value(gf.PROCESSES, n)),),
        mig_devices=(MigDevice(**_group_value(gf.MIG_DEVICES, n)),),
        compute_capability=(8 + n % 2, n % 10),
    )


def test_every_field_of_a_gpu_sample_is_described_once() -> None:
    described = [f.name for f in (*gf.IDENTITY, *gf.SCALARS)] + [g.name for g in gf.GROUPS]
    attributes = [f.name for f in dataclasses.fields(GpuSample)]
    assert set(described) == set(attributes)
    scalar_names = [f.name for f in (*gf.IDENTITY, *gf.SCALARS)]
    assert len(scalar_names) == len(set(scalar_names))
    keys = [f.key for f in (*gf.IDENTITY, *gf.SCALARS)] + [g.key for g in gf.GROUPS]
    assert len(keys) == len(set(keys)), "two fields share a key in gpu.jsonl"
    assert set(GPU_KEYS.values()) == set(keys)


@pytest.mark.parametrize(
    ("groups", "cls"),
    [
        ((gf.ECC,), EccCounts),
        ((gf.REMAPPED_ROWS,), RemappedRows),
        ((gf.PCIE_LINK, gf.PCIE_TRAFFIC), PcieLink),
        ((gf.PROCESSES,), GpuProcess),
        ((gf.MIG_DEVICES,), MigDevice),
    ],
)
def test_each_group_lists_every_member_of_its_type(groups: tuple[gf.Group, ...], cls: type) -> None:
    members = [m for g in groups for m in g.member_names]
    assert sorted(members) == sorted(f.name for f in dataclasses.fields(cls))


def test_every_field_round_trips_through_the_record() -> None:
    encoder, decoder = GpuSampleEncoder(), GpuSampleDecoder()
    first = _sample(1)
    assert decoder.decode(encoder.encode(first)) == first
    # Then each field alone changes: the delta line carries it and only it.
    current = first
    changed = _sample(2)
    for f in dataclasses.fields(GpuSample):
        if f.name in ("timestamp", "index"):
            continue
        current = dataclasses.replace(current, **{f.name: getattr(changed, f.name)})
        line = encoder.encode(current)
        assert set(line) - {"t", "i"}, f"a change of {f.name} wrote nothing"
        assert decoder.decode(line) == current, f.name


def test_a_field_that_became_unknown_round_trips_as_unknown() -> None:
    encoder, decoder = GpuSampleEncoder(), GpuSampleDecoder()
    decoder.decode(encoder.encode(_sample(3)))
    optional = [f.name for f in gf.SCALARS if f.name != "name"]
    unknown = dataclasses.replace(_sample(3), **dict.fromkeys(optional))
    assert decoder.decode(encoder.encode(unknown)) == unknown


def test_the_simulation_file_takes_every_simulated_field_with_its_kind() -> None:
    want = _sample(4)
    gpu: dict[str, Any] = {"name": want.name, "uuid": want.uuid}
    for f in gf.SCALARS:
        if f.simulated:
            gpu[f.name] = getattr(want, f.name)
    gpu["unreachable"] = None  # a lost GPU's readings are all unknown
    _, gpus, _, _ = parse_document({"driver": {"version": "550.54.15"}, "gpus": [gpu]}, "t.json")
    got = gpus[0]
    for f in gf.SCALARS:
        if f.simulated and f.name != "unreachable":
            assert getattr(got, f.name) == getattr(want, f.name), f.name


@pytest.mark.parametrize("field", [f for f in gf.SCALARS if f.simulated], ids=lambda f: f.name)
def test_the_simulation_file_refuses_a_value_of_another_kind(field: gf.Scalar) -> None:
    wrong = {"text": 3, "int": "3", "float": "3.5", "bool": "yes"}[field.kind]
    gpu = {"name": "G", "uuid": "GPU-1", "memory_total_bytes": 1 << 30, field.name: wrong}
    from trainmedic.errors import SimulationFileError

    with pytest.raises(SimulationFileError, match=field.name):
        parse_document({"driver": {"version": "550.54.15"}, "gpus": [gpu]}, "t.json")
