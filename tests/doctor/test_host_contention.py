"""Host contention checks: others' CPU, load not visible here, steal, others' memory."""

from __future__ import annotations

from support.facts import (
    GIB,
    finding_keys,
    make_cpu_facts,
    make_facts,
    make_host_facts,
    make_memory_facts,
)
from trainmedic.doctor.checks.host_contention import (
    CHECKS,
    check_others_cpu,
    check_others_memory,
    check_steal,
    check_unseen_load,
    describe_process,
)
from trainmedic.findings.model import Category
from trainmedic.host.types import HostProcess

BOB_TRAINING = HostProcess(pid=900, user="bob", name="python", cpu_pct=1450.0, rss_bytes=90 * GIB)
CAROL_ETL = HostProcess(pid=901, user="carol", name="spark", cpu_pct=300.0, rss_bytes=40 * GIB)
IDLE_DAEMON = HostProcess(pid=50, user="root", name="sshd", cpu_pct=0.0, rss_bytes=8 << 20)


def test_healthy_host_gives_no_contention_finding() -> None:
    facts = make_facts()
    assert [f for check in CHECKS for f in check(facts)] == []


def test_others_using_half_the_usable_cores_warn_and_name_the_processes() -> None:
    host = make_host_facts(
        cpu=make_cpu_facts(others_busy_cores=17.5, busy_pct=60.0),
        top_processes=(IDLE_DAEMON, CAROL_ETL, BOB_TRAINING),
    )
    [f] = check_others_cpu(make_facts(host=host))
    assert (f.id, f.category, f.severity.value) == (
        "contention.host_cpu.other_users",
        Category.CONTENTION,
        "warning",
    )
    assert f.evidence["others_busy_cores"] == 17.5
    assert f.evidence["threshold_cores"] == 16.0
    assert f.evidence["other_users"] == ["bob", "carol"]
    # Busiest first; the idle daemon is not named.
    assert f.evidence["top_processes"] == [
        "pid 900 (bob, python, 1450% CPU, 90.0 GiB)",
        "pid 901 (carol, spark, 300% CPU, 40.0 GiB)",
    ]


def test_others_threshold_follows_the_usable_cores() -> None:
    # 3 cores taken by others: nothing on 32 usable cores, contention on 4.
    wide = make_host_facts(cpu=make_cpu_facts(others_busy_cores=3.0))
    narrow = make_host_facts(cpu=make_cpu_facts(others_busy_cores=3.0, cgroup_quota_cores=4.0))
    assert check_others_cpu(make_facts(host=wide)) == []
    assert len(check_others_cpu(make_facts(host=narrow))) == 1


def test_saturated_host_with_invisible_load_warns() -> None:
    cpu = make_cpu_facts(busy_pct=95.0, own_busy_cores=2.0, others_busy_cores=0.0)
    [f] = check_unseen_load(make_facts(host=make_host_facts(cpu=cpu)))
    assert f.id == "contention.host_cpu.unseen_load"
    assert f.evidence["busy_cores"] == 30.4
    assert f.evidence["unseen_busy_cores"] == 28.4


def test_saturated_host_busy_with_own_work_is_quiet() -> None:
    cpu = make_cpu_facts(busy_pct=95.0, own_busy_cores=30.0, others_busy_cores=0.0)
    assert check_unseen_load(make_facts(host=make_host_facts(cpu=cpu))) == []


def test_steal_time_warns() -> None:
    findings = check_steal(make_facts(host=make_host_facts(cpu=make_cpu_facts(steal_pct=22.0))))
    assert finding_keys(findings) == {("contention.host_cpu.steal", "warning", "host")}
    assert findings[0].evidence["steal_pct"] == 22.0
    low = make_host_facts(cpu=make_cpu_facts(steal_pct=3.0))
    assert check_steal(make_facts(host=low)) == []


def test_others_holding_memory_while_it_is_short_warn() -> None:
    host = make_host_facts(
        memory=make_memory_facts(
            total_bytes=256 * GIB, available_bytes=100 * GIB, others_rss_bytes=130 * GIB
        ),
        top_processes=(CAROL_ETL, BOB_TRAINING),
    )
    [f] = check_others_memory(make_facts(host=host))
    assert f.id == "contention.host_memory.other_users"
    assert f.evidence["others_rss_gib"] == 130.0
    # Largest first.
    assert f.evidence["top_processes"][0].startswith("pid 900 (bob")


def test_others_memory_is_capped_at_memory_in_use() -> None:
    # Summed RSS double-counts shared pages; 300 GiB "held" on a 256 GiB host.
    host = make_host_facts(
        memory=make_memory_facts(
            total_bytes=256 * GIB, available_bytes=96 * GIB, others_rss_bytes=300 * GIB
        )
    )
    [f] = check_others_memory(make_facts(host=host))
    assert f.evidence["others_rss_gib"] == 160.0


def test_others_memory_with_plenty_available_is_quiet() -> None:
    host = make_host_facts(
        memory=make_memory_facts(
            total_bytes=512 * GIB, available_bytes=300 * GIB, others_rss_bytes=200 * GIB
        )
    )
    assert check_others_memory(make_facts(host=host)) == []


def test_describe_process_without_visible_owner() -> None:
    p = HostProcess(pid=7, user=None, name="x", cpu_pct=99.6, rss_bytes=0)
    assert describe_process(p) == "pid 7 (owner not visible, x, 100% CPU, 0.0 GiB)"
