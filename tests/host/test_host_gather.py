"""gather_host_facts: computed from a fake system probe, and for real on this machine."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from trainmedic.host.gather import DEFAULT_WINDOW_S, TRAINING_ENV_VARS, gather_host_facts, read_shm
from trainmedic.host.system import CpuTimes, MemoryReading, ProcessReading, PsutilProbe
from trainmedic.host.types import HostFacts, HostProcess

GIB = 1 << 30
MIB = 1 << 20


class FakeClock:
    """Monotonic time that only moves when slept on."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


WALL = 1_700_000_000.0
"""Unix time when the first reading starts."""


def proc(
    pid: int,
    uid: int,
    cpu_s: float,
    rss_bytes: int = 100 * MIB,
    name: str = "python",
    started_at: float = 1_600_000_000.0,
    children_cpu_s: float = 0.0,
) -> ProcessReading:
    users = {0: "root", 1000: "alice", 1001: "bob", 1002: "carol"}
    return ProcessReading(
        pid=pid,
        uid=uid,
        user=users.get(uid),
        name=name,
        cpu_s=cpu_s,
        rss_bytes=rss_bytes,
        started_at=started_at,
        children_cpu_s=children_cpu_s,
    )


@dataclass
class FakeProbe:
    """Two readings of a small shared host; each call returns the next reading."""

    cpu_readings: list[CpuTimes]
    memory_readings: list[MemoryReading]
    process_readings: list[list[ProcessReading]]
    uid: int | None = 1000
    logical: int = 8
    affinity: int | None = 6
    calls: list[str] = field(default_factory=list)

    def hostname(self) -> str:
        return "node-7"

    def current_user(self) -> tuple[int | None, str]:
        return self.uid, "alice"

    def logical_cores(self) -> int:
        return self.logical

    def affinity_cores(self) -> int | None:
        return self.affinity

    def load_avg_1m(self) -> float | None:
        return 3.5

    def cpu_times(self) -> CpuTimes:
        return self.cpu_readings.pop(0)

    def memory(self) -> MemoryReading:
        return self.memory_readings.pop(0)

    def processes(self) -> Iterable[ProcessReading]:
        return self.process_readings.pop(0)


def make_probe(uid: int | None = 1000) -> FakeProbe:
    """A 0.2 s window on a shared host; CPU used in it, in core-seconds:

    alice (the user) 0.1; bob 0.3 himself + 0.2 of reaped short-lived children;
    carol's pid 30 and pid 50 exit (80.04 and 9.02 s over their lives, 0.06 s
    of it in the window) and systemd reaps them; carol starts pid 30 again
    (0.05) and pid 40 (0.1) inside the window.
    """
    before = [
        proc(1, 0, 3.0, rss_bytes=12 * MIB, name="systemd", children_cpu_s=100.0),
        proc(10, 1001, 50.0, rss_bytes=4 * GIB, children_cpu_s=2.0),
        proc(20, 1000, 5.0),
        proc(30, 1002, 80.0),
        proc(50, 1002, 9.0),
    ]
    after = [
        proc(1, 0, 3.0, rss_bytes=12 * MIB, name="systemd", children_cpu_s=189.06),
        proc(10, 1001, 50.3, rss_bytes=4 * GIB, children_cpu_s=2.2),
        proc(20, 1000, 5.1),
        proc(30, 1002, 0.05, name="sh", started_at=WALL + 0.05),  # the pid, reused
        proc(40, 1002, 0.1, rss_bytes=8 * GIB, name="new", started_at=WALL + 0.1),
        # Unreadable in the first reading and old: its lifetime must not count.
        proc(60, 1002, 500.0, name="late"),
    ]
    return FakeProbe(
        cpu_readings=[
            CpuTimes(busy_s=100.0, total_s=800.0, steal_s=10.0),
            CpuTimes(busy_s=101.2, total_s=801.6, steal_s=10.16),
        ],
        memory_readings=[
            MemoryReading(64 * GIB, 40 * GIB, 8 * GIB, 1 * GIB, 0, 0),
            MemoryReading(64 * GIB, 39 * GIB, 8 * GIB, 1 * GIB, 2 * MIB, 0),
        ],
        process_readings=[before, after],
        uid=uid,
    )


def gather(probe: FakeProbe, root: Path, **kwargs: Any) -> HostFacts:
    """gather_host_facts on the fake probe with fake clocks; returns the facts."""
    clock = FakeClock()
    kwargs.setdefault("environ", {})
    facts = gather_host_facts(
        probe,
        root=str(root),
        sleep=clock.sleep,
        clock=clock,
        wall_clock=lambda: WALL,
        **kwargs,
    )
    assert clock.slept == [kwargs.get("window_s", DEFAULT_WINDOW_S)]
    return facts


def write_v2_cgroup(root: Path, memory_max: int, cpu_max: str = "300000 100000") -> Path:
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/self/cgroup").write_text("0::/\n")
    (root / "proc/self/mountinfo").write_text(
        "30 25 0:30 / /sys/fs/cgroup rw shared:4 - cgroup2 cgroup2 rw\n"
    )
    cg = root / "sys/fs/cgroup"
    cg.mkdir(parents=True)
    (cg / "cgroup.controllers").write_text("cpu memory\n")
    (cg / "cpu.max").write_text(cpu_max + "\n")
    (cg / "cpu.stat").write_text("nr_periods 200\nnr_throttled 30\nthrottled_usec 4000000\n")
    (cg / "memory.max").write_text(f"{memory_max}\n")
    (cg / "memory.current").write_text(f"{10 * GIB}\n")
    (cg / "memory.stat").write_text(f"inactive_file {2 * GIB}\n")
    (cg / "memory.events").write_text("oom_kill 4\n")
    return root


def test_rates_come_from_two_readings_one_window_apart(tmp_path: Path) -> None:
    facts = gather(make_probe(), write_v2_cgroup(tmp_path, memory_max=16 * GIB), window_s=0.2)
    cpu = facts.cpu
    assert (cpu.logical_cores, cpu.affinity_cores, cpu.cgroup_quota_cores) == (8, 6, 3.0)
    assert cpu.usable_cores == 3.0
    assert (cpu.total_periods, cpu.throttled_periods, cpu.throttled_s) == (200, 30, 4.0)
    assert cpu.load_avg_1m == 3.5
    assert cpu.busy_pct == pytest.approx(75.0)  # 1.2 of 1.6 core-seconds
    assert cpu.steal_pct == pytest.approx(10.0)


def test_busy_cores_count_short_lived_processes_once(tmp_path: Path) -> None:
    cpu = gather(make_probe(), tmp_path).cpu
    # others: bob 0.5 + exited-and-reaped 0.06 + born in the window 0.15, over 0.2 s.
    assert cpu.others_busy_cores == pytest.approx(3.55)
    assert cpu.own_busy_cores == pytest.approx(0.5)


def test_unknown_user_id_counts_everything_as_others(tmp_path: Path) -> None:
    cpu = gather(make_probe(uid=None), tmp_path).cpu
    assert cpu.others_busy_cores == pytest.approx(4.05)
    assert cpu.own_busy_cores is None


def test_memory_facts_include_the_cgroup_and_swap_traffic(tmp_path: Path) -> None:
    m = gather(make_probe(), write_v2_cgroup(tmp_path, memory_max=16 * GIB)).memory
    assert (m.total_bytes, m.available_bytes) == (64 * GIB, 39 * GIB)
    assert (m.swap_total_bytes, m.swap_used_bytes) == (8 * GIB, GIB)
    assert m.swap_in_bytes_per_s == pytest.approx(2 * MIB / DEFAULT_WINDOW_S)
    assert m.swap_out_bytes_per_s == 0.0
    assert m.cgroup_limit_bytes == 16 * GIB
    assert (m.cgroup_usage_bytes, m.cgroup_working_set_bytes) == (10 * GIB, 8 * GIB)
    assert m.cgroup_oom_kills == 4
    # Memory is a level: every process of the second reading that is not alice's.
    assert m.others_rss_bytes == 12 * MIB + 4 * GIB + 100 * MIB + 8 * GIB + 100 * MIB


def test_limit_above_the_host_ram_counts_as_unlimited(tmp_path: Path) -> None:
    root = write_v2_cgroup(tmp_path, memory_max=128 * GIB, cpu_max="max 100000")
    facts = gather(make_probe(), root)
    assert facts.memory.cgroup_limit_bytes is None
    assert facts.cpu.cgroup_quota_cores is None


def test_top_processes_are_other_users_busiest_then_largest(tmp_path: Path) -> None:
    facts = gather(make_probe(), tmp_path)
    # Per-process rates need both readings: carol's new processes have none yet.
    assert facts.top_processes == (
        HostProcess(pid=10, user="bob", name="python", cpu_pct=150.0, rss_bytes=4 * GIB),
        HostProcess(pid=1, user="root", name="systemd", cpu_pct=0.0, rss_bytes=12 * MIB),
    )
    assert (facts.hostname, facts.user) == ("node-7", "alice")


def test_only_training_relevant_environment_is_kept(tmp_path: Path) -> None:
    environ = {
        "OMP_NUM_THREADS": "4",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "HOME": "/home/alice",
        "AWS_SECRET_ACCESS_KEY": "never-report-me",
    }
    facts = gather(make_probe(), tmp_path, environ=environ)
    assert dict(facts.env) == {
        "OMP_NUM_THREADS": "4",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
    }


def test_no_cgroup_visible_leaves_cgroup_fields_empty(tmp_path: Path) -> None:
    facts = gather(make_probe(), tmp_path)
    assert facts.cpu.cgroup_quota_cores is None
    assert facts.cpu.total_periods is None
    assert facts.memory.cgroup_limit_bytes is None
    assert facts.memory.cgroup_oom_kills is None


def test_shm_is_read_from_the_given_path(tmp_path: Path) -> None:
    facts = gather(make_probe(), tmp_path, shm_path=str(tmp_path))
    assert facts.shm is not None and facts.shm.path == str(tmp_path)
    assert gather(make_probe(), tmp_path, shm_path=str(tmp_path / "absent")).shm is None


def test_read_shm_sizes_a_directory_and_misses_an_absent_one(tmp_path: Path) -> None:
    shm = read_shm(str(tmp_path))
    assert shm is not None and shm.total_bytes is not None and shm.free_bytes is not None
    assert 0 <= shm.free_bytes <= shm.total_bytes
    assert read_shm(str(tmp_path / "absent")) is None


def test_this_machine_is_gathered_quickly_and_sanely() -> None:
    started = time.perf_counter()
    facts = gather_host_facts()
    elapsed_s = time.perf_counter() - started
    assert elapsed_s < 0.5
    cpu = facts.cpu
    assert cpu.logical_cores == os.cpu_count()
    assert 0 < cpu.usable_cores <= cpu.logical_cores
    if cpu.affinity_cores is not None:
        assert cpu.affinity_cores == len(os.sched_getaffinity(0))
    assert cpu.busy_pct is not None and 0.0 <= cpu.busy_pct <= 100.0
    assert cpu.others_busy_cores is not None and cpu.others_busy_cores >= 0.0
    m = facts.memory
    assert 0 < m.available_bytes <= m.total_bytes
    assert 0 <= m.swap_used_bytes <= max(m.swap_total_bytes, m.swap_used_bytes)
    assert all(p.user != facts.user for p in facts.top_processes)
    assert set(facts.env) <= set(TRAINING_ENV_VARS)
    assert facts.hostname


def write_proc_stat(proc: Path, pid: int, name: str, rest: list[int]) -> None:
    """/proc/<pid>/stat: pid, (name), state, then ``rest`` from ppid on (proc(5))."""
    (proc / str(pid)).mkdir()
    line = f"{pid} ({name}) S " + " ".join(str(v) for v in rest) + "\n"
    (proc / str(pid) / "stat").write_bytes(line.encode())


def test_procfs_processes_are_parsed_from_stat_lines(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "stat").write_text("cpu  1 2 3 4\nbtime 1700000000\nprocesses 99\n")
    # ppid..cmajflt (9 values), utime stime cutime cstime, priority nice threads
    # itrealvalue, starttime, vsize, rss, then more.
    rest = [1, 5, 5, 0, -1, 4194560, 10, 0, 0, 0, 250, 50, 100, 0, 20, 0, 4, 0, 500, 9999, 1000, 7]
    write_proc_stat(proc, 4242, "my (odd) name", rest)
    write_proc_stat(proc, 4243, "short", rest[:10])  # truncated: skipped
    (proc / "4244").mkdir()  # exited between listing and reading: skipped
    (proc / "self").mkdir()
    tick_hz = os.sysconf("SC_CLK_TCK")
    probe = PsutilProbe(proc_root=str(proc))
    [reading] = list(probe.processes())
    assert reading.pid == 4242
    assert reading.name == "my (odd) name"
    assert reading.uid == os.getuid()
    assert reading.user == probe.current_user()[1]
    assert reading.cpu_s == pytest.approx(300 / tick_hz)
    assert reading.children_cpu_s == pytest.approx(100 / tick_hz)
    assert reading.started_at == pytest.approx(1_700_000_000 + 500 / tick_hz)
    assert reading.rss_bytes == 1000 * os.sysconf("SC_PAGE_SIZE")


def test_procfs_and_psutil_agree_on_this_process() -> None:
    fast = {p.pid: p for p in PsutilProbe().processes()}[os.getpid()]
    portable = {p.pid: p for p in PsutilProbe(proc_root=None).processes()}[os.getpid()]
    assert (fast.uid, fast.user) == (portable.uid, portable.user)
    assert fast.started_at == pytest.approx(portable.started_at, abs=1.0)
    assert fast.cpu_s == pytest.approx(portable.cpu_s, abs=0.5)
    assert fast.rss_bytes == pytest.approx(portable.rss_bytes, rel=0.2)
