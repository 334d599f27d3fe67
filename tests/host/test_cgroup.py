"""cgroup v1/v2 reading over fake /proc and /sys trees built in tmp_path."""

from __future__ import annotations

from pathlib import Path

from trainmedic.host.cgroup import (
    CgroupCpu,
    CgroupMemory,
    locate_cgroup,
    read_cgroup,
    read_cpu,
    read_memory,
)

GIB = 1 << 30
V1_UNLIMITED = "9223372036854771712"


def mount_line(mount_id: int, root: str, mount_point: str, fs_type: str, options: str) -> str:
    """One /proc/self/mountinfo line (with one optional field, as on real systems)."""
    return (
        f"{mount_id} 25 0:{mount_id} {root} {mount_point} rw,nosuid,nodev,noexec,relatime "
        f"shared:{mount_id} - {fs_type} {fs_type} {options}"
    )


def make_tree(root: Path, cgroup: list[str], mounts: list[str], files: dict[str, str]) -> Path:
    """A fake filesystem: /proc/self/{cgroup,mountinfo} plus cgroup files (path -> text)."""
    proc = root / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text("\n".join(cgroup) + "\n")
    unrelated = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw"
    (proc / "mountinfo").write_text("\n".join([unrelated, *mounts]) + "\n")
    for path, text in files.items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return root


def v2_container(root: Path) -> Path:
    """A container with its own cgroup namespace: 2 CPUs, 8 GiB, throttled, 2 OOM kills."""
    cg = "/sys/fs/cgroup"
    return make_tree(
        root,
        ["0::/"],
        [mount_line(30, "/", cg, "cgroup2", "rw,nsdelegate,memory_recursiveprot")],
        {
            f"{cg}/cgroup.controllers": "cpuset cpu io memory pids\n",
            f"{cg}/cpu.max": "200000 100000\n",
            f"{cg}/cpu.stat": (
                "usage_usec 9000000\nuser_usec 7000000\nsystem_usec 2000000\n"
                "nr_periods 1000\nnr_throttled 250\nthrottled_usec 12500000\n"
                "nr_bursts 0\nburst_usec 0\n"
            ),
            f"{cg}/memory.max": f"{8 * GIB}\n",
            f"{cg}/memory.current": f"{6 * GIB}\n",
            f"{cg}/memory.peak": f"{7 * GIB}\n",
            f"{cg}/memory.stat": f"anon {4 * GIB}\nfile {2 * GIB}\ninactive_file {GIB}\n",
            f"{cg}/memory.events": "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\n",
        },
    )


def test_v2_container_reads_quota_throttling_limit_and_oom_kills(tmp_path: Path) -> None:
    state = read_cgroup(v2_container(tmp_path))
    assert state.cpu == CgroupCpu(
        version=2,
        path=str(tmp_path / "sys/fs/cgroup"),
        quota_cores=2.0,
        periods=1000,
        throttled_periods=250,
        throttled_s=12.5,
    )
    assert state.cpu.throttled_share == 0.25
    assert state.memory == CgroupMemory(
        version=2,
        path=str(tmp_path / "sys/fs/cgroup"),
        limit_bytes=8 * GIB,
        usage_bytes=6 * GIB,
        peak_bytes=7 * GIB,
        inactive_file_bytes=GIB,
        oom_kills=2,
    )
    assert state.memory.working_set_bytes == 5 * GIB


def test_v2_nested_cgroup_takes_the_tightest_ancestor_limit(tmp_path: Path) -> None:
    cg = "/sys/fs/cgroup"
    user = f"{cg}/user.slice/user-1000.slice"
    scope = f"{user}/session-3.scope"
    make_tree(
        tmp_path,
        ["0::/user.slice/user-1000.slice/session-3.scope"],
        [mount_line(30, "/", cg, "cgroup2", "rw,nsdelegate")],
        {
            f"{scope}/cgroup.controllers": "cpu memory\n",
            f"{scope}/cpu.max": "max 100000\n",
            f"{scope}/cpu.stat": "nr_periods 0\nnr_throttled 0\nthrottled_usec 0\n",
            f"{scope}/memory.max": "max\n",
            f"{scope}/memory.current": f"{GIB}\n",
            f"{user}/cpu.max": "150000 100000\n",
            f"{user}/cpu.stat": "nr_periods 400\nnr_throttled 40\nthrottled_usec 2000000\n",
            f"{user}/memory.max": f"{16 * GIB}\n",
            f"{user}/memory.current": f"{3 * GIB}\n",
            f"{user}/memory.events": "oom_kill 1\n",
            f"{cg}/user.slice/cpu.max": "400000 100000\n",
            f"{cg}/user.slice/memory.max": f"{64 * GIB}\n",
        },
    )
    where = locate_cgroup(tmp_path)
    assert where.cpu is not None and where.memory is not None
    assert where.cpu.cgroup_dir == tmp_path / scope.lstrip("/")
    assert [p.name for p in where.cpu.chain()] == [
        "session-3.scope",
        "user-1000.slice",
        "user.slice",
        "cgroup",
    ]
    cpu = read_cpu(where.cpu)
    # The binding quota is user-1000.slice's; its counters are the ones that move.
    assert (cpu.quota_cores, cpu.periods, cpu.throttled_periods, cpu.throttled_s) == (
        1.5,
        400,
        40,
        2.0,
    )
    assert cpu.path == str(tmp_path / user.lstrip("/"))
    memory = read_memory(where.memory)
    assert (memory.limit_bytes, memory.usage_bytes, memory.oom_kills) == (16 * GIB, 3 * GIB, 1)


def test_v2_without_limits_reads_the_own_cgroup(tmp_path: Path) -> None:
    cg = "/sys/fs/cgroup"
    own = f"{cg}/system.slice/train.service"
    make_tree(
        tmp_path,
        ["0::/system.slice/train.service"],
        [mount_line(30, "/", cg, "cgroup2", "rw")],
        {
            f"{own}/cgroup.controllers": "cpu memory\n",
            f"{own}/cpu.max": "max 100000\n",
            f"{own}/cpu.stat": "nr_periods 0\nnr_throttled 0\nthrottled_usec 0\n",
            f"{own}/memory.max": "max\n",
            f"{own}/memory.current": "123456789\n",
            f"{own}/memory.events": "oom_kill 0\n",
        },
    )
    state = read_cgroup(tmp_path)
    assert state.cpu is not None and state.memory is not None
    assert state.cpu.quota_cores is None
    assert state.cpu.throttled_share is None  # no period ran: no quota to enforce
    assert state.memory.limit_bytes is None
    assert state.memory.usage_bytes == 123456789
    assert state.memory.path == str(tmp_path / own.lstrip("/"))


def test_v1_docker_container_mounts_its_own_cgroup_at_the_mount_point(tmp_path: Path) -> None:
    cid = "/docker/3f1c9e"
    make_tree(
        tmp_path,
        [
            "12:pids:/docker/3f1c9e",
            "5:cpu,cpuacct:/docker/3f1c9e",
            "4:memory:/docker/3f1c9e",
            "1:name=systemd:/docker/3f1c9e",
            "0::/system.slice/containerd.service",
        ],
        [
            mount_line(40, cid, "/sys/fs/cgroup/cpu,cpuacct", "cgroup", "rw,cpu,cpuacct"),
            mount_line(41, cid, "/sys/fs/cgroup/memory", "cgroup", "rw,memory"),
            mount_line(42, cid, "/sys/fs/cgroup/pids", "cgroup", "rw,pids"),
        ],
        {
            "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "400000\n",
            "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
            "/sys/fs/cgroup/cpu,cpuacct/cpu.stat": (
                "nr_periods 5000\nnr_throttled 600\nthrottled_time 30000000000\n"
            ),
            "/sys/fs/cgroup/memory/memory.limit_in_bytes": f"{4 * GIB}\n",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes": f"{3 * GIB}\n",
            "/sys/fs/cgroup/memory/memory.max_usage_in_bytes": f"{4 * GIB}\n",
            "/sys/fs/cgroup/memory/memory.stat": (
                f"cache {GIB}\ninactive_file 1\ntotal_inactive_file {GIB // 2}\n"
            ),
            "/sys/fs/cgroup/memory/memory.oom_control": (
                "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n"
            ),
        },
    )
    state = read_cgroup(tmp_path)
    assert state.cpu == CgroupCpu(
        version=1,
        path=str(tmp_path / "sys/fs/cgroup/cpu,cpuacct"),
        quota_cores=4.0,
        periods=5000,
        throttled_periods=600,
        throttled_s=30.0,
    )
    assert state.memory is not None
    assert (state.memory.version, state.memory.limit_bytes, state.memory.peak_bytes) == (
        1,
        4 * GIB,
        4 * GIB,
    )
    assert state.memory.working_set_bytes == 3 * GIB - GIB // 2  # total_* is the subtree's
    assert state.memory.oom_kills == 1


def test_v1_hybrid_host_with_nested_memory_cgroup_and_unlimited_values(tmp_path: Path) -> None:
    nested = "/process_api/9583986b"
    make_tree(
        tmp_path,
        ["4:memory:/process_api/9583986b", "1:cpu:/", "0::/"],
        [
            mount_line(32, "/", "/sys/fs/cgroup/cpu", "cgroup", "rw,cpu"),
            mount_line(35, "/", "/sys/fs/cgroup/memory", "cgroup", "rw,memory"),
            mount_line(41, "/", "/sys/fs/cgroup/unified", "cgroup2", "rw"),
        ],
        {
            "/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n",
            "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n",
            "/sys/fs/cgroup/cpu/cpu.stat": "nr_periods 0\nnr_throttled 0\nthrottled_time 0\n",
            f"/sys/fs/cgroup/memory{nested}/memory.limit_in_bytes": V1_UNLIMITED + "\n",
            f"/sys/fs/cgroup/memory{nested}/memory.usage_in_bytes": "8888320\n",
            "/sys/fs/cgroup/memory/process_api/memory.limit_in_bytes": V1_UNLIMITED + "\n",
            "/sys/fs/cgroup/memory/memory.limit_in_bytes": V1_UNLIMITED + "\n",
            "/sys/fs/cgroup/unified/cgroup.controllers": "\n",
        },
    )
    state = read_cgroup(tmp_path)
    assert state.cpu is not None and state.memory is not None
    assert (state.cpu.version, state.cpu.quota_cores, state.cpu.throttled_s) == (1, None, 0.0)
    assert state.memory.limit_bytes is None
    assert state.memory.usage_bytes == 8888320
    assert state.memory.path == str(tmp_path / f"sys/fs/cgroup/memory{nested}".lstrip("/"))


def test_v2_controller_not_enabled_is_not_visible(tmp_path: Path) -> None:
    make_tree(
        tmp_path,
        ["0::/"],
        [mount_line(41, "/", "/sys/fs/cgroup", "cgroup2", "rw")],
        {"/sys/fs/cgroup/cgroup.controllers": "pids io\n"},
    )
    state = read_cgroup(tmp_path)
    assert (state.cpu, state.memory) == (None, None)


def test_path_outside_every_mount_root_falls_back_to_the_mount_point(tmp_path: Path) -> None:
    # The process moved to another cgroup after the container mounted its own.
    make_tree(
        tmp_path,
        ["4:memory:/elsewhere/job"],
        [mount_line(35, "/docker/abc", "/sys/fs/cgroup/memory", "cgroup", "rw,memory")],
        {"/sys/fs/cgroup/memory/memory.limit_in_bytes": f"{2 * GIB}\n"},
    )
    state = read_cgroup(tmp_path)
    assert state.memory is not None
    assert state.memory.limit_bytes == 2 * GIB


def test_escaped_mount_point_is_unescaped(tmp_path: Path) -> None:
    make_tree(
        tmp_path,
        ["0::/"],
        [mount_line(30, "/", "/sys/fs/my\\040cgroup", "cgroup2", "rw")],
        {
            "/sys/fs/my cgroup/cgroup.controllers": "memory\n",
            "/sys/fs/my cgroup/memory.max": "1073741824\n",
        },
    )
    state = read_cgroup(tmp_path)
    assert state.memory is not None and state.memory.limit_bytes == GIB


def test_no_proc_files_means_no_cgroup(tmp_path: Path) -> None:
    state = read_cgroup(tmp_path)
    assert (state.cpu, state.memory) == (None, None)


def test_malformed_files_read_as_unknown(tmp_path: Path) -> None:
    cg = "/sys/fs/cgroup"
    make_tree(
        tmp_path,
        ["0::/", "garbage line", "x:y"],
        [mount_line(30, "/", cg, "cgroup2", "rw"), "short line - cgroup2"],
        {
            f"{cg}/cgroup.controllers": "cpu memory\n",
            f"{cg}/cpu.max": "lots 100000\n",
            f"{cg}/cpu.stat": "nr_periods many\nnr_throttled 3\n",
            f"{cg}/memory.max": "-5\n",
            f"{cg}/memory.current": "\n",
        },
    )
    state = read_cgroup(tmp_path)
    assert state.cpu is not None and state.memory is not None
    assert (state.cpu.quota_cores, state.cpu.periods, state.cpu.throttled_periods) == (
        None,
        None,
        3,
    )
    assert (state.memory.limit_bytes, state.memory.usage_bytes) == (None, None)
    assert state.memory.working_set_bytes is None


def test_this_machine_reads_without_error() -> None:
    state = read_cgroup()
    for part in (state.cpu, state.memory):
        if part is not None:
            assert part.version in (1, 2)
    if state.cpu is not None and state.cpu.quota_cores is not None:
        assert state.cpu.quota_cores > 0
    if state.memory is not None and state.memory.usage_bytes is not None:
        assert state.memory.usage_bytes > 0
