"""Every field of :class:`~trainmedic.gpu.types.GpuSample`, described once.

The run record's codec (:mod:`trainmedic.record.gpu_codec`: the short key of each
field in ``gpu.jsonl``, how it is decoded, whether it is rounded) and the simulation
file (:mod:`trainmedic.gpu.simulation_file`: which JSON types each field accepts)
are both derived from these tables, so a field added to ``GpuSample`` is added here
and nowhere else; a test pins that every dataclass field is described and
round-trips through the codec.

Units are those of ``GpuSample``'s attributes (bytes, percent, degrees Celsius,
watts, MHz).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["text", "int", "float", "bool"]
"""How a value is stored and checked: a string, an integer, any finite number, a
boolean (``None`` always means unknown)."""

JSON_TYPES: dict[Kind, tuple[type, ...]] = {
    "text": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
}
"""The JSON types a simulation file may give a field of each kind."""


@dataclass(frozen=True)
class Scalar:
    """One plain field of ``GpuSample``.

    Attributes:
        name: the attribute.
        key: its key in ``gpu.jsonl``.
        kind: how it is stored and checked.
        rounded: stored to :data:`~trainmedic.record.values.PCT_DIGITS` decimals
            (readings; not counters or identities).
        simulated: a simulation file sets it as a plain value (identities such as the
            name, the UUID and the PCI address have rules of their own there).
    """

    name: str
    key: str
    kind: Kind
    rounded: bool = False
    simulated: bool = True


@dataclass(frozen=True)
class Group:
    """A field of ``GpuSample`` stored as a fixed array of its members' values.

    Attributes:
        name: the attribute holding the group (several groups may share one
            attribute: the PCIe link and its traffic are both ``pcie``).
        key: its key in ``gpu.jsonl``.
        members: (member attribute, kind), in the array's order.
        rows: a tuple of such records (processes, MIG devices), each an array.
    """

    name: str
    key: str
    members: tuple[tuple[str, Kind], ...]
    rows: bool = False

    @property
    def member_names(self) -> tuple[str, ...]:
        return tuple(m for m, _ in self.members)


IDENTITY = (Scalar("timestamp", "t", "float", simulated=False),
            Scalar("index", "i", "int", simulated=False))  # fmt: skip
"""Present on every line: when, and which GPU."""

SCALARS: tuple[Scalar, ...] = (
    Scalar("name", "nm", "text", simulated=False),
    Scalar("uuid", "id", "text", simulated=False),
    Scalar("memory_total_bytes", "mt", "int"),
    Scalar("memory_used_bytes", "mu", "int"),
    Scalar("utilization_gpu_pct", "ug", "float", rounded=True),
    Scalar("utilization_memory_pct", "um", "float", rounded=True),
    Scalar("temperature_c", "tc", "float", rounded=True),
    Scalar("temperature_slowdown_c", "tsd", "float", rounded=True),
    Scalar("temperature_shutdown_c", "tsh", "float", rounded=True),
    Scalar("power_draw_w", "pw", "float", rounded=True),
    Scalar("power_limit_w", "pl", "float", rounded=True),
    Scalar("sm_clock_mhz", "sm", "float", rounded=True),
    Scalar("sm_clock_max_mhz", "smx", "float", rounded=True),
    Scalar("clock_event_reasons", "ce", "int"),
    Scalar("retired_pages_pending", "rpp", "bool"),
    Scalar("persistence_mode", "pm", "bool"),
    Scalar("pci_bus_id", "pci", "text", simulated=False),
    Scalar("mig_mode", "mig", "bool"),
    Scalar("processes_unreadable", "pru", "text"),
    Scalar("unreachable", "un", "text"),
    Scalar("unavailable", "na", "text"),
    Scalar("fabric", "fab", "text"),
)

_INT4: tuple[tuple[str, Kind], ...] = (
    ("volatile_corrected", "int"),
    ("volatile_uncorrected", "int"),
    ("aggregate_corrected", "int"),
    ("aggregate_uncorrected", "int"),
)
ECC = Group("ecc", "ecc", _INT4)
REMAPPED_ROWS = Group(
    "remapped_rows",
    "rr",
    (("correctable", "int"), ("uncorrectable", "int"), ("pending", "bool"), ("failure", "bool")),
)
PCIE_LINK = Group(
    "pcie",
    "lk",
    (("gen_current", "int"), ("gen_max", "int"), ("gen_gpu_max", "int"),
     ("width_current", "int"), ("width_max", "int")),
)  # fmt: skip
PCIE_TRAFFIC = Group("pcie", "tr", (("tx_kib_per_s", "int"), ("rx_kib_per_s", "int")))
PROCESSES = Group(
    "processes",
    "pr",
    (("pid", "int"), ("used_memory_bytes", "int"), ("user", "text"), ("name", "text")),
    rows=True,
)
MIG_DEVICES = Group(
    "mig_devices",
    "migd",
    (("uuid", "text"), ("gpu_instance_id", "int"), ("compute_instance_id", "int"),
     ("memory_total_bytes", "int"), ("memory_used_bytes", "int")),
    rows=True,
)  # fmt: skip
COMPUTE_CAPABILITY = Group("compute_capability", "cc", (("major", "int"), ("minor", "int")))

GROUPS: tuple[Group, ...] = (
    ECC, REMAPPED_ROWS, PCIE_LINK, PCIE_TRAFFIC, PROCESSES, MIG_DEVICES, COMPUTE_CAPABILITY,
)  # fmt: skip


def record_keys() -> dict[str, str]:
    """Field -> key in ``gpu.jsonl`` (the PCIe link's two arrays under their own
    names, ``pcie_link`` and ``pcie_traffic``), for docs/run-record.md's table."""
    keys = {f.name: f.key for f in (*IDENTITY, *SCALARS)}
    for g in GROUPS:
        name = {"lk": "pcie_link", "tr": "pcie_traffic"}.get(g.key, g.name)
        keys[name] = g.key
    return keys
