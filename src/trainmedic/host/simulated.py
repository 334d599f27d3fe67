"""Host facts from a simulation file's ``host`` section (docs/simulation-format.md).

Every field is optional and defaults to a healthy host, so ``"host": {}``
keeps the host checks quiet and a file states only what it wants to show:
``{"shm": {"total_bytes": 67108864}}`` is a container with Docker's 64 MiB
``/dev/shm`` and nothing else wrong.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainmedic.errors import SimulationFileError
from trainmedic.host.types import CpuFacts, HostFacts, HostProcess, MemoryFacts, ShmFacts

GIB = 1024**3

HEALTHY_HOSTNAME = "simulated-host"
HEALTHY_USER = "trainer"
HEALTHY_LOGICAL_CORES = 32
HEALTHY_MEMORY_BYTES = 256 * GIB
HEALTHY_AVAILABLE_SHARE = 0.9
"""Share of RAM available when the file gives only ``total_bytes``."""
HEALTHY_SHM_BYTES = 64 * GIB

_INT = "an integer"
_NUMBER = "a number"

# field -> (kind, may be null)
_CPU_FIELDS: dict[str, tuple[str, bool]] = {
    "logical_cores": (_INT, False),
    "affinity_cores": (_INT, True),
    "cgroup_quota_cores": (_NUMBER, True),
    "throttled_periods": (_INT, True),
    "total_periods": (_INT, True),
    "throttled_s": (_NUMBER, True),
    "load_avg_1m": (_NUMBER, True),
    "busy_pct": (_NUMBER, True),
    "others_busy_cores": (_NUMBER, True),
    "own_busy_cores": (_NUMBER, True),
    "steal_pct": (_NUMBER, True),
}
_MEMORY_FIELDS: dict[str, tuple[str, bool]] = {
    "total_bytes": (_INT, False),
    "available_bytes": (_INT, False),
    "swap_total_bytes": (_INT, False),
    "swap_used_bytes": (_INT, False),
    "cgroup_limit_bytes": (_INT, True),
    "cgroup_usage_bytes": (_INT, True),
    "cgroup_working_set_bytes": (_INT, True),
    "cgroup_oom_kills": (_INT, True),
    "others_rss_bytes": (_INT, True),
    "swap_in_bytes_per_s": (_NUMBER, True),
    "swap_out_bytes_per_s": (_NUMBER, True),
}
_SHM_FIELDS: dict[str, tuple[str, bool]] = {
    "total_bytes": (_INT, True),
    "free_bytes": (_INT, True),
}
_PROCESS_FIELDS: dict[str, tuple[str, bool]] = {
    "pid": (_INT, False),
    "cpu_pct": (_NUMBER, False),
    "rss_bytes": (_INT, False),
}
_HOST_KEYS = {"hostname", "user", "cpu", "memory", "shm", "env", "top_processes"}


def host_facts_from_dict(data: object, source: str) -> HostFacts:
    """Parse a ``host`` section; omitted fields take healthy defaults.

    Raises:
        SimulationFileError: naming ``source`` and the offending field
            (``host.cpu.logical_cores``).
    """
    return _HostParser(source).host(data)


class _HostParser:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, field: str, problem: str) -> SimulationFileError:
        return SimulationFileError(self.source, field, problem)

    def host(self, data: object) -> HostFacts:
        raw = self.section("host", data, _HOST_KEYS)
        cpu = self.cpu(raw.get("cpu", {}))
        return HostFacts(
            hostname=self.text("host.hostname", raw.get("hostname", HEALTHY_HOSTNAME)),
            user=self.text("host.user", raw.get("user", HEALTHY_USER)),
            cpu=cpu,
            memory=self.memory(raw.get("memory", {})),
            shm=self.shm(raw.get("shm", {})),
            env=self.env(raw.get("env", {})),
            top_processes=self.processes(raw.get("top_processes", [])),
        )

    def section(self, where: str, data: object, known: set[str] | None) -> Mapping[str, Any]:
        """An object whose keys are all in ``known`` (any keys when ``None``)."""
        if not isinstance(data, dict):
            raise self.fail(where, "expected an object")
        unknown = sorted(set(data) - known) if known is not None else []
        if unknown:
            raise self.fail(f"{where}.{unknown[0]}", "unknown field")
        return data

    def cpu(self, data: object) -> CpuFacts:
        raw = self.section("host.cpu", data, set(_CPU_FIELDS))
        fields = self.numbers("host.cpu", raw, _CPU_FIELDS)
        logical = fields.setdefault("logical_cores", HEALTHY_LOGICAL_CORES)
        if logical < 1:
            raise self.fail("host.cpu.logical_cores", "must be at least 1")
        fields.setdefault("affinity_cores", logical)
        affinity = fields["affinity_cores"]
        if affinity is not None and not 1 <= affinity <= logical:
            raise self.fail(
                "host.cpu.affinity_cores", f"must be within 1..{logical} (logical_cores)"
            )
        quota = fields.get("cgroup_quota_cores")
        if quota is not None and quota <= 0:
            raise self.fail("host.cpu.cgroup_quota_cores", "must be above 0 (null: unlimited)")
        for name in ("busy_pct", "steal_pct"):
            value = fields.get(name)
            if value is not None and value > 100:
                raise self.fail(f"host.cpu.{name}", "must be within 0..100")
        self.not_above("host.cpu", fields, "throttled_periods", "total_periods")
        fields.setdefault("load_avg_1m", 1.0)
        fields.setdefault("busy_pct", 5.0)
        fields.setdefault("others_busy_cores", 0.0)
        fields.setdefault("own_busy_cores", 0.0)
        fields.setdefault("steal_pct", 0.0)
        return CpuFacts(**fields)

    def memory(self, data: object) -> MemoryFacts:
        raw = self.section("host.memory", data, set(_MEMORY_FIELDS))
        fields = self.numbers("host.memory", raw, _MEMORY_FIELDS)
        total = fields.setdefault("total_bytes", HEALTHY_MEMORY_BYTES)
        if total <= 0:
            raise self.fail("host.memory.total_bytes", "must be above 0")
        fields.setdefault("available_bytes", int(total * HEALTHY_AVAILABLE_SHARE))
        fields.setdefault("swap_total_bytes", fields.get("swap_used_bytes", 0))
        self.not_above("host.memory", fields, "available_bytes", "total_bytes")
        self.not_above("host.memory", fields, "swap_used_bytes", "swap_total_bytes")
        fields.setdefault("others_rss_bytes", 0)
        fields.setdefault("swap_in_bytes_per_s", 0.0)
        fields.setdefault("swap_out_bytes_per_s", 0.0)
        return MemoryFacts(**fields)

    def shm(self, data: object) -> ShmFacts | None:
        if data is None:
            return None
        raw = self.section("host.shm", data, {*_SHM_FIELDS, "path"})
        path = self.text("host.shm.path", raw.get("path", "/dev/shm"))
        fields = self.numbers("host.shm", raw, _SHM_FIELDS)
        total = fields.get("total_bytes", HEALTHY_SHM_BYTES)
        free = fields.get("free_bytes", total)
        if total is not None and free is not None and free > total:
            raise self.fail("host.shm.free_bytes", "must not exceed host.shm.total_bytes")
        return ShmFacts(path=path, total_bytes=total, free_bytes=free)

    def env(self, data: object) -> dict[str, str]:
        raw = self.section("host.env", data, None)
        for name, value in raw.items():
            if not isinstance(value, str):
                raise self.fail(
                    f"host.env.{name}", "expected a string (environment values are text)"
                )
        return dict(raw)

    def processes(self, data: object) -> tuple[HostProcess, ...]:
        if not isinstance(data, list):
            raise self.fail("host.top_processes", "expected a list of processes")
        out: list[HostProcess] = []
        for i, item in enumerate(data):
            where = f"host.top_processes[{i}]"
            raw = self.section(where, item, {*_PROCESS_FIELDS, "user", "name"})
            for required in _PROCESS_FIELDS:
                if required not in raw:
                    raise self.fail(f"{where}.{required}", "missing (required)")
            fields = self.numbers(where, raw, _PROCESS_FIELDS)
            if fields["pid"] <= 0:
                raise self.fail(f"{where}.pid", "expected a positive integer")
            user = raw.get("user")
            if user is not None and not isinstance(user, str):
                raise self.fail(f"{where}.user", "expected a string or null")
            out.append(
                HostProcess(
                    pid=fields["pid"],
                    user=user,
                    name=self.text(f"{where}.name", raw.get("name", "?")),
                    cpu_pct=float(fields["cpu_pct"]),
                    rss_bytes=fields["rss_bytes"],
                )
            )
        return tuple(out)

    def numbers(
        self, where: str, raw: Mapping[str, Any], spec: Mapping[str, tuple[str, bool]]
    ) -> dict[str, Any]:
        """The fields of ``spec`` present in ``raw``, type-checked and not negative."""
        out: dict[str, Any] = {}
        for name, (kind, nullable) in spec.items():
            if name not in raw:
                continue
            value = raw[name]
            at = f"{where}.{name}"
            if value is None:
                if not nullable:
                    raise self.fail(at, f"expected {kind}, got null")
                out[name] = None
                continue
            if isinstance(value, bool):
                raise self.fail(at, f"expected {kind}, got a boolean")
            if not isinstance(value, (int, float)) or (kind == _INT and not isinstance(value, int)):
                raise self.fail(at, f"expected {kind}, got {_json_type(value)}")
            if value < 0:
                raise self.fail(at, "must not be negative")
            out[name] = value
        return out

    def not_above(self, where: str, fields: Mapping[str, Any], part: str, whole: str) -> None:
        part_value = fields.get(part)
        whole_value = fields.get(whole)
        if part_value is not None and whole_value is not None and part_value > whole_value:
            raise self.fail(f"{where}.{part}", f"must not exceed {where}.{whole}")

    def text(self, at: str, value: object) -> str:
        if not isinstance(value, str) or not value:
            raise self.fail(at, "expected a non-empty string")
        return value


def _json_type(value: object) -> str:
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, float):
        return "a fractional number"
    return type(value).__name__
