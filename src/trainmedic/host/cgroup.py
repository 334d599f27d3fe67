"""A process's cgroup: CPU quota and throttling, memory limit, usage and OOM kills.

Reads cgroup v2 (unified) and v1 (one hierarchy per controller, including the
hybrid layout where v1 controllers sit next to an empty v2 mount). The cgroup
is found the way the kernel describes it: ``/proc/<pid>/cgroup`` names the
cgroup's path inside each hierarchy and ``/proc/<pid>/mountinfo`` says where
that hierarchy, or a subtree of it (as in a container), is mounted.

Limits of ancestor cgroups apply too, so the effective limit is the smallest
one on the path from the cgroup up to its mount point (ancestors above the
mount, outside a container's view, cannot be seen). Counters (throttling,
usage, OOM kills) are read at the cgroup whose limit binds, where the kernel
charges them against that limit, or at the process's own cgroup when nothing
is limited.

Use :func:`locate_cgroup` once and :func:`read_cpu` / :func:`read_memory` as
often as needed (a supervisor polling for throttling or OOM kills), or
:func:`read_cgroup` for a one-off reading. Every function takes ``root``, the
filesystem root the ``/proc`` and ``/sys`` paths are read under, so tests
build fake trees. A file that is missing, unreadable or malformed gives
``None`` for what it would have said: cgroup files vary by kernel version.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainmedic.host.mounts import parse_mountinfo

# v1 reports "no memory limit" as the largest page-aligned 63-bit value
# (9223372036854771712 with 4 KiB pages, a little less with 64 KiB pages);
# no real limit comes near 2**62 bytes (4 EiB).
_UNLIMITED_BYTES = 2**62


@dataclass(frozen=True)
class CgroupLocation:
    """Where one controller's cgroup of a process lives.

    Attributes:
        version: 1 or 2.
        mount_dir: the mount point of the hierarchy (or the subtree a container sees).
        cgroup_dir: the process's own cgroup directory, inside ``mount_dir``.
    """

    version: int
    mount_dir: Path
    cgroup_dir: Path

    def chain(self) -> list[Path]:
        """The cgroup directory and its ancestors up to the mount point, innermost first."""
        dirs = [self.cgroup_dir]
        current = self.cgroup_dir
        while current != self.mount_dir and self.mount_dir in current.parents:
            current = current.parent
            dirs.append(current)
        return dirs


@dataclass(frozen=True)
class CgroupLocations:
    """The cgroups of a process's ``cpu`` and ``memory`` controllers (``None``: not visible)."""

    cpu: CgroupLocation | None
    memory: CgroupLocation | None


@dataclass(frozen=True)
class CgroupCpu:
    """CPU limit and throttling of a cgroup.

    Attributes:
        version: 1 or 2.
        path: the directory the counters were read from.
        quota_cores: CFS quota divided by period, in cores; ``None`` when unlimited.
        periods: enforcement periods that elapsed while the cgroup ran
            (``nr_periods``; counts only while a quota is set).
        throttled_periods: periods in which the cgroup used up its quota and was
            stopped (``nr_throttled``).
        throttled_s: total time the cgroup's tasks were stopped by the quota, seconds.
    """

    version: int
    path: str
    quota_cores: float | None
    periods: int | None
    throttled_periods: int | None
    throttled_s: float | None

    @property
    def throttled_share(self) -> float | None:
        """Throttled periods over all periods, 0..1 (``None`` before any period)."""
        if self.periods is None or self.throttled_periods is None or self.periods <= 0:
            return None
        return min(1.0, self.throttled_periods / self.periods)


@dataclass(frozen=True)
class CgroupMemory:
    """Memory limit, usage and OOM kills of a cgroup, bytes.

    Attributes:
        version: 1 or 2.
        path: the directory the counters were read from.
        limit_bytes: the effective limit; ``None`` when unlimited.
        usage_bytes: memory charged to the cgroup, page cache included.
        peak_bytes: the highest usage seen (v2 ``memory.peak`` needs Linux 5.19).
        inactive_file_bytes: page cache the kernel can drop first.
        oom_kills: processes killed by the OOM killer (v1 needs Linux 4.13).
    """

    version: int
    path: str
    limit_bytes: int | None
    usage_bytes: int | None
    peak_bytes: int | None
    inactive_file_bytes: int | None
    oom_kills: int | None

    @property
    def working_set_bytes(self) -> int | None:
        """Usage minus inactive page cache: what the OOM killer weighs against the limit."""
        if self.usage_bytes is None:
            return None
        return max(0, self.usage_bytes - (self.inactive_file_bytes or 0))


@dataclass(frozen=True)
class CgroupState:
    """One reading of a process's cgroup (``None`` parts: controller not visible)."""

    cpu: CgroupCpu | None
    memory: CgroupMemory | None


@dataclass(frozen=True)
class _Mount:
    root: str
    mount_point: str
    fs_type: str
    super_options: frozenset[str]


def locate_cgroup(root: str | Path = "/", pid: int | str = "self") -> CgroupLocations:
    """Find the ``cpu`` and ``memory`` cgroup directories of process ``pid``."""
    base = Path(root)
    memberships = _read_memberships(base / "proc" / str(pid) / "cgroup")
    mounts = _read_mounts(base / "proc" / str(pid) / "mountinfo")
    return CgroupLocations(
        cpu=_locate(base, "cpu", memberships, mounts),
        memory=_locate(base, "memory", memberships, mounts),
    )


def read_cgroup(root: str | Path = "/", pid: int | str = "self") -> CgroupState:
    """Locate and read the cgroup of process ``pid`` once."""
    where = locate_cgroup(root, pid)
    return CgroupState(
        cpu=read_cpu(where.cpu) if where.cpu else None,
        memory=read_memory(where.memory) if where.memory else None,
    )


def read_cpu(location: CgroupLocation) -> CgroupCpu:
    """CPU quota and throttling counters of a located cgroup."""
    quota: float | None = None
    binding = location.cgroup_dir
    for directory in location.chain():
        cores = _cpu_quota_cores(directory, location.version)
        if cores is not None and (quota is None or cores < quota):
            quota, binding = cores, directory
    stat = _read_keyed(binding / "cpu.stat")
    if location.version == 2:
        throttled_us = stat.get("throttled_usec")
        throttled_s = throttled_us / 1e6 if throttled_us is not None else None
    else:
        throttled_ns = stat.get("throttled_time")
        throttled_s = throttled_ns / 1e9 if throttled_ns is not None else None
    return CgroupCpu(
        version=location.version,
        path=str(binding),
        quota_cores=quota,
        periods=stat.get("nr_periods"),
        throttled_periods=stat.get("nr_throttled"),
        throttled_s=throttled_s,
    )


def read_memory(location: CgroupLocation) -> CgroupMemory:
    """Memory limit, usage and OOM kills of a located cgroup."""
    v2 = location.version == 2
    limit: int | None = None
    binding = location.cgroup_dir
    for directory in location.chain():
        value = _read_bytes_limit(directory / ("memory.max" if v2 else "memory.limit_in_bytes"))
        if value is not None and (limit is None or value < limit):
            limit, binding = value, directory
    stat = _read_keyed(binding / "memory.stat")
    if v2:
        usage = _read_int(binding / "memory.current")
        peak = _read_int(binding / "memory.peak")
        inactive_file = stat.get("inactive_file")
        oom_kills = _read_keyed(binding / "memory.events").get("oom_kill")
    else:
        usage = _read_int(binding / "memory.usage_in_bytes")
        peak = _read_int(binding / "memory.max_usage_in_bytes")
        # total_* counts the whole subtree, as usage_in_bytes does.
        inactive_file = stat.get("total_inactive_file", stat.get("inactive_file"))
        oom_kills = _read_keyed(binding / "memory.oom_control").get("oom_kill")
    return CgroupMemory(
        version=location.version,
        path=str(binding),
        limit_bytes=limit,
        usage_bytes=usage,
        peak_bytes=peak,
        inactive_file_bytes=inactive_file,
        oom_kills=oom_kills,
    )


def _locate(
    base: Path, controller: str, memberships: dict[str, tuple[int, str]], mounts: list[_Mount]
) -> CgroupLocation | None:
    membership = memberships.get(controller)
    if membership is not None:
        candidates = [m for m in mounts if m.fs_type == "cgroup" and controller in m.super_options]
        found = _resolve(base, 1, membership[1], candidates)
        if found is not None:
            return found
    unified = memberships.get("")
    if unified is None:
        return None
    candidates = [m for m in mounts if m.fs_type == "cgroup2"]
    location = _resolve(base, 2, unified[1], candidates)
    if location is None:
        return None
    # In v2 a controller works in a cgroup only when its parent enabled it;
    # hybrid hosts mount an empty v2 hierarchy next to the v1 controllers.
    enabled = _read_text(location.cgroup_dir / "cgroup.controllers")
    if enabled is None or controller not in enabled.split():
        return None
    return location


def _resolve(
    base: Path, version: int, cgroup_path: str, mounts: list[_Mount]
) -> CgroupLocation | None:
    """Map the cgroup's path in its hierarchy onto a mounted directory.

    A mount shows the hierarchy from its ``root`` down; the cgroup is visible
    through it when that root is a prefix of the cgroup's path. With a cgroup
    namespace, or when the process was moved after the mount, the path may not
    lie below any mount root: then the mount point itself is the best view.
    """
    best: tuple[int, CgroupLocation] | None = None
    fallback: CgroupLocation | None = None
    for mount in mounts:
        mount_dir = base / mount.mount_point.lstrip("/")
        if fallback is None:
            fallback = CgroupLocation(version, mount_dir, mount_dir)
        relative = _relative_below(cgroup_path, mount.root)
        if relative is None:
            continue
        cgroup_dir = mount_dir / relative if relative else mount_dir
        if not cgroup_dir.is_dir():
            continue
        depth = len(mount.root.rstrip("/"))
        if best is None or depth > best[0]:
            best = (depth, CgroupLocation(version, mount_dir, cgroup_dir))
    if best is not None:
        return best[1]
    if fallback is not None and fallback.mount_dir.is_dir():
        return fallback
    return None


def _relative_below(path: str, ancestor: str) -> str | None:
    """``path`` relative to ``ancestor`` (``""`` when equal), ``None`` if not below it."""
    ancestor = ancestor.rstrip("/")
    path = path.rstrip("/")
    if path == ancestor:
        return ""
    if path.startswith(ancestor + "/"):
        return path[len(ancestor) + 1 :]
    return None


def _read_memberships(path: Path) -> dict[str, tuple[int, str]]:
    """``/proc/<pid>/cgroup``: controller -> (hierarchy id, path); v2 is the key ``""``."""
    text = _read_text(path)
    out: dict[str, tuple[int, str]] = {}
    if text is None:
        return out
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        hierarchy, controllers, cgroup_path = int(parts[0]), parts[1], parts[2]
        if hierarchy == 0 and controllers == "":
            out[""] = (0, cgroup_path)
            continue
        for controller in controllers.split(","):
            if controller:
                out[controller] = (hierarchy, cgroup_path)
    return out


def _read_mounts(path: Path) -> list[_Mount]:
    """The cgroup and cgroup2 mounts listed in ``/proc/<pid>/mountinfo``."""
    text = _read_text(path)
    if text is None:
        return []
    return [
        _Mount(
            root=m.root,
            mount_point=m.mount_point,
            fs_type=m.fs_type,
            super_options=frozenset(m.super_options.split(",")),
        )
        for m in parse_mountinfo(text)
        if m.fs_type in ("cgroup", "cgroup2")
    ]


def _cpu_quota_cores(directory: Path, version: int) -> float | None:
    if version == 2:
        text = _read_text(directory / "cpu.max")
        if text is None:
            return None
        parts = text.split()
        if len(parts) != 2 or parts[0] == "max":
            return None
        quota, period = _to_int(parts[0]), _to_int(parts[1])
    else:
        quota = _read_int(directory / "cpu.cfs_quota_us")
        period = _read_int(directory / "cpu.cfs_period_us")
    if quota is None or period is None or quota <= 0 or period <= 0:
        return None
    return quota / period


def _read_bytes_limit(path: Path) -> int | None:
    text = _read_text(path)
    if text is None or text.strip() == "max":
        return None
    value = _to_int(text.strip())
    if value is None or value < 0 or value >= _UNLIMITED_BYTES:
        return None
    return value


def _read_keyed(path: Path) -> dict[str, int]:
    """A flat-keyed file (``name value`` per line) as integers."""
    text = _read_text(path)
    out: dict[str, int] = {}
    if text is None:
        return out
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            value = _to_int(parts[1])
            if value is not None:
                out[parts[0]] = value
    return out


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    return None if text is None else _to_int(text.strip())


def _to_int(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
