"""The simulation file's ``host`` section: healthy defaults, overrides, and every error."""

from __future__ import annotations

from typing import Any

import pytest

from trainmedic.doctor.checks import cpu, framework, host_contention, host_memory
from trainmedic.doctor.facts import GpuFacts, MachineFacts
from trainmedic.errors import SimulationFileError
from trainmedic.host.simulated import host_facts_from_dict
from trainmedic.host.types import HostProcess, ShmFacts

GIB = 1 << 30
SOURCE = "examples/simulations/busy-host.json"


def test_empty_section_is_a_healthy_host() -> None:
    host = host_facts_from_dict({}, SOURCE)
    assert (host.hostname, host.user) == ("simulated-host", "trainer")
    assert (host.cpu.logical_cores, host.cpu.usable_cores) == (32, 32.0)
    assert host.cpu.cgroup_quota_cores is None
    assert host.memory.total_bytes == 256 * GIB
    assert host.memory.available_bytes > 200 * GIB
    assert host.memory.swap_used_bytes == 0
    assert host.memory.cgroup_limit_bytes is None
    assert host.shm == ShmFacts("/dev/shm", 64 * GIB, 64 * GIB)
    assert dict(host.env) == {}
    assert host.top_processes == ()


def test_empty_section_keeps_every_host_check_quiet() -> None:
    facts = MachineFacts(
        host=host_facts_from_dict({}, SOURCE),
        gpu=GpuFacts(backend="simulated", driver=None, samples=()),
        torch=None,
    )
    modules = (cpu, host_memory, host_contention, framework)
    assert [f for m in modules for check in m.CHECKS for f in check(facts)] == []


def test_every_part_can_be_overridden() -> None:
    host = host_facts_from_dict(
        {
            "hostname": "rented-box",
            "user": "alice",
            "cpu": {"logical_cores": 64, "cgroup_quota_cores": 4, "steal_pct": 12.5},
            "memory": {"total_bytes": 32 * GIB, "swap_used_bytes": GIB},
            "shm": {"total_bytes": 64 << 20},
            "env": {"OMP_NUM_THREADS": "64"},
            "top_processes": [
                {"pid": 4, "user": "bob", "name": "python", "cpu_pct": 800, "rss_bytes": GIB}
            ],
        },
        SOURCE,
    )
    assert (host.hostname, host.user) == ("rented-box", "alice")
    assert host.cpu.affinity_cores == 64  # follows logical_cores unless given
    assert host.cpu.usable_cores == 4.0
    assert host.cpu.steal_pct == 12.5
    # available follows total_bytes; swap_total covers the swap in use.
    assert host.memory.available_bytes == int(32 * GIB * 0.9)
    assert (host.memory.swap_total_bytes, host.memory.swap_used_bytes) == (GIB, GIB)
    assert host.shm == ShmFacts("/dev/shm", 64 << 20, 64 << 20)
    assert dict(host.env) == {"OMP_NUM_THREADS": "64"}
    assert host.top_processes == (
        HostProcess(pid=4, user="bob", name="python", cpu_pct=800.0, rss_bytes=GIB),
    )


def test_null_shm_means_no_shared_memory_filesystem() -> None:
    assert host_facts_from_dict({"shm": None}, SOURCE).shm is None


def test_nullable_fields_accept_null() -> None:
    host = host_facts_from_dict(
        {"cpu": {"affinity_cores": None, "steal_pct": None}, "memory": {"others_rss_bytes": None}},
        SOURCE,
    )
    assert host.cpu.affinity_cores is None
    assert host.cpu.steal_pct is None
    assert host.memory.others_rss_bytes is None


@pytest.mark.parametrize(
    ("section", "field", "problem"),
    [
        ([], "host", "expected an object"),
        ({"gpu": {}}, "host.gpu", "unknown field"),
        ({"hostname": 7}, "host.hostname", "expected a non-empty string"),
        ({"user": ""}, "host.user", "expected a non-empty string"),
        ({"cpu": 8}, "host.cpu", "expected an object"),
        ({"cpu": {"cores": 8}}, "host.cpu.cores", "unknown field"),
        ({"cpu": {"logical_cores": "8"}}, "host.cpu.logical_cores", "expected an integer"),
        ({"cpu": {"logical_cores": 8.5}}, "host.cpu.logical_cores", "expected an integer"),
        ({"cpu": {"logical_cores": True}}, "host.cpu.logical_cores", "got a boolean"),
        ({"cpu": {"logical_cores": None}}, "host.cpu.logical_cores", "got null"),
        ({"cpu": {"logical_cores": 0}}, "host.cpu.logical_cores", "at least 1"),
        ({"cpu": {"affinity_cores": 40}}, "host.cpu.affinity_cores", "within 1..32"),
        ({"cpu": {"cgroup_quota_cores": 0}}, "host.cpu.cgroup_quota_cores", "above 0"),
        ({"cpu": {"busy_pct": 140}}, "host.cpu.busy_pct", "within 0..100"),
        ({"cpu": {"steal_pct": -1}}, "host.cpu.steal_pct", "must not be negative"),
        ({"cpu": {"load_avg_1m": "high"}}, "host.cpu.load_avg_1m", "expected a number"),
        (
            {"cpu": {"throttled_periods": 10, "total_periods": 5}},
            "host.cpu.throttled_periods",
            "must not exceed host.cpu.total_periods",
        ),
        ({"memory": []}, "host.memory", "expected an object"),
        ({"memory": {"ram": 1}}, "host.memory.ram", "unknown field"),
        ({"memory": {"total_bytes": 0}}, "host.memory.total_bytes", "above 0"),
        ({"memory": {"total_bytes": 1.5e9}}, "host.memory.total_bytes", "expected an integer"),
        (
            {"memory": {"total_bytes": 10, "available_bytes": 11}},
            "host.memory.available_bytes",
            "must not exceed host.memory.total_bytes",
        ),
        (
            {"memory": {"swap_total_bytes": 1, "swap_used_bytes": 2}},
            "host.memory.swap_used_bytes",
            "must not exceed host.memory.swap_total_bytes",
        ),
        ({"memory": {"swap_used_bytes": None}}, "host.memory.swap_used_bytes", "got null"),
        ({"shm": "64m"}, "host.shm", "expected an object"),
        ({"shm": {"size": 1}}, "host.shm.size", "unknown field"),
        ({"shm": {"path": 3}}, "host.shm.path", "expected a non-empty string"),
        ({"shm": {"total_bytes": -1}}, "host.shm.total_bytes", "must not be negative"),
        (
            {"shm": {"total_bytes": 10, "free_bytes": 20}},
            "host.shm.free_bytes",
            "must not exceed host.shm.total_bytes",
        ),
        ({"env": ["OMP_NUM_THREADS=4"]}, "host.env", "expected an object"),
        ({"env": {"OMP_NUM_THREADS": 4}}, "host.env.OMP_NUM_THREADS", "expected a string"),
        ({"top_processes": {}}, "host.top_processes", "expected a list"),
        ({"top_processes": [7]}, "host.top_processes[0]", "expected an object"),
        (
            {"top_processes": [{"pid": 1, "cpu_pct": 1, "rss_bytes": 1, "cmd": "x"}]},
            "host.top_processes[0].cmd",
            "unknown field",
        ),
        (
            {"top_processes": [{"pid": 1, "rss_bytes": 1}]},
            "host.top_processes[0].cpu_pct",
            "missing (required)",
        ),
        (
            {"top_processes": [{"pid": 0, "cpu_pct": 1, "rss_bytes": 1}]},
            "host.top_processes[0].pid",
            "positive integer",
        ),
        (
            {"top_processes": [{"pid": 1, "cpu_pct": 1, "rss_bytes": 1, "user": 5}]},
            "host.top_processes[0].user",
            "expected a string or null",
        ),
        (
            {"top_processes": [{"pid": 1, "cpu_pct": 1, "rss_bytes": 1, "name": ""}]},
            "host.top_processes[0].name",
            "expected a non-empty string",
        ),
    ],
)
def test_malformed_section_names_file_and_field(section: Any, field: str, problem: str) -> None:
    with pytest.raises(SimulationFileError) as caught:
        host_facts_from_dict(section, SOURCE)
    err = caught.value
    assert (err.path, err.field) == (SOURCE, field)
    assert problem in err.problem
    message = str(err)
    assert message.startswith(f"simulation file {SOURCE}: {field}: ")
    assert "\n" not in message
