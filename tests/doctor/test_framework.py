"""framework_config checks: /dev/shm and the environment torch, CUDA and NCCL read."""

from __future__ import annotations

import pytest

from support.facts import GIB, finding_keys, make_facts, make_gpu_sample, make_host_facts
from trainmedic.doctor.checks.framework import (
    CHECKS,
    alloc_conf_problems,
    check_alloc_conf,
    check_shm,
    switch_check,
)
from trainmedic.doctor.facts import MachineFacts
from trainmedic.findings.model import Category
from trainmedic.host.types import ShmFacts

check_launch_blocking = switch_check("CUDA_LAUNCH_BLOCKING")
check_no_memory_caching = switch_check("PYTORCH_NO_CUDA_MEMORY_CACHING")
check_distributed_debug = switch_check("TORCH_DISTRIBUTED_DEBUG")
check_nccl_p2p = switch_check("NCCL_P2P_DISABLE")

MIB = 1 << 20


def with_env(env: dict[str, str], gpus: int = 1) -> MachineFacts:
    return make_facts(gpus=[make_gpu_sample() for _ in range(gpus)], host=make_host_facts(env=env))


def with_shm(total: int | None, free: int | None) -> MachineFacts:
    shm = ShmFacts(path="/dev/shm", total_bytes=total, free_bytes=free)
    return make_facts(host=make_host_facts(shm=shm))


def test_healthy_machine_gives_no_framework_finding() -> None:
    facts = make_facts()
    assert [f for check in CHECKS for f in check(facts)] == []


def test_docker_default_shm_warns_with_the_docker_and_kubernetes_fix() -> None:
    [f] = check_shm(with_shm(64 * MIB, 64 * MIB))
    assert (f.id, f.category, f.severity.value) == (
        "framework_config.shm.small",
        Category.FRAMEWORK_CONFIG,
        "warning",
    )
    assert f.evidence["shm_total_mib"] == 64.0
    assert "--shm-size=16g" in f.fix
    assert "--ipc=host" in f.fix
    assert "medium: Memory" in f.fix


def test_large_but_full_shm_warns() -> None:
    [f] = check_shm(with_shm(32 * GIB, 200 * MIB))
    assert f.id == "framework_config.shm.full"
    assert f.evidence["shm_free_mib"] == 200.0


def test_missing_or_large_shm_is_quiet() -> None:
    assert check_shm(make_facts(host=make_host_facts(shm=None))) == []
    assert check_shm(with_shm(2 * GIB, 2 * GIB)) == []


def test_cuda_launch_blocking_warns_only_when_on_and_gpus_exist() -> None:
    findings = check_launch_blocking(with_env({"CUDA_LAUNCH_BLOCKING": "1"}))
    assert finding_keys(findings) == {
        ("framework_config.env.cuda_launch_blocking", "warning", "host")
    }
    assert "unset CUDA_LAUNCH_BLOCKING" in findings[0].fix
    assert check_launch_blocking(with_env({"CUDA_LAUNCH_BLOCKING": "0"})) == []
    assert check_launch_blocking(with_env({"CUDA_LAUNCH_BLOCKING": "1"}, gpus=0)) == []


@pytest.mark.parametrize(("value", "fires"), [("1", True), ("true", True), ("0", False)])
def test_no_cuda_memory_caching(value: str, fires: bool) -> None:
    findings = check_no_memory_caching(with_env({"PYTORCH_NO_CUDA_MEMORY_CACHING": value}))
    assert [f.id for f in findings] == (
        ["framework_config.env.no_cuda_memory_caching"] if fires else []
    )


def test_distributed_debug_detail_warns_but_info_level_does_not() -> None:
    [f] = check_distributed_debug(with_env({"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}))
    assert f.id == "framework_config.env.distributed_debug_detail"
    assert check_distributed_debug(with_env({"TORCH_DISTRIBUTED_DEBUG": "INFO"})) == []


def test_debug_output_switches_are_not_flagged() -> None:
    env = {"TORCH_SHOW_CPP_STACKTRACES": "1", "NCCL_DEBUG": "INFO"}
    facts = with_env(env, gpus=2)
    assert [f for check in CHECKS for f in check(facts)] == []


def test_nccl_p2p_disabled_is_info_on_multi_gpu_machines_only() -> None:
    findings = check_nccl_p2p(with_env({"NCCL_P2P_DISABLE": "1"}, gpus=4))
    assert finding_keys(findings) == {("framework_config.env.nccl_p2p_disabled", "info", "host")}
    assert findings[0].evidence["gpu_count"] == 4
    assert check_nccl_p2p(with_env({"NCCL_P2P_DISABLE": "1"}, gpus=1)) == []


def test_valid_alloc_conf_is_reported_as_info() -> None:
    value = "expandable_segments:True,max_split_size_mb:512"
    findings = check_alloc_conf(with_env({"PYTORCH_CUDA_ALLOC_CONF": value}))
    assert finding_keys(findings) == {("framework_config.env.alloc_conf", "info", "host")}
    assert findings[0].evidence == {"pytorch_cuda_alloc_conf": value}


def test_alloc_conf_torch_rejects_warns_naming_each_entry() -> None:
    value = "expandable_segments:true,garbage_collection_threshold:1.5"
    [f] = check_alloc_conf(with_env({"PYTORCH_ALLOC_CONF": value}))
    assert (f.id, f.severity.value) == ("framework_config.env.alloc_conf_invalid", "warning")
    assert f.evidence["invalid_entries"] == [
        "expandable_segments:true: expects True or False (capitalised)",
        "garbage_collection_threshold:1.5: expects a fraction between 0 and 1",
    ]
    assert "PYTORCH_ALLOC_CONF" in f.fix


def test_alloc_conf_is_not_judged_without_gpus() -> None:
    facts = with_env({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:true"}, gpus=0)
    assert check_alloc_conf(facts) == []


@pytest.mark.parametrize(
    ("value", "problems", "unknown"),
    [
        ("expandable_segments:True", [], []),
        ("max_split_size_mb:128, garbage_collection_threshold:0.6,", [], []),
        ("roundup_power2_divisions:[256:1,512:2,>:4],backend:cudaMallocAsync", [], []),
        (
            "expandable_segment:True",
            ["unknown key 'expandable_segment' (did you mean 'expandable_segments'?)"],
            [],
        ),
        ("some_future_key:3", [], ["some_future_key"]),
        ("max_split_size_mb", ["expected key:value"], []),
        ("max_split_size_mb:8", ["must be at least 20 (MiB)"], []),
        ("max_split_size_mb:big", ["expects a whole number of MiB"], []),
        ("backend:cudamallocasync", ["expects native or cudaMallocAsync"], []),
        ("pinned_num_register_threads:x", ["expects a whole number"], []),
        (
            "roundup_power2_divisions:four",
            ["expects a whole number or a [size:divisions,...] list"],
            [],
        ),
        ("per_process_memory_fraction:0", ["expects a fraction between 0 and 1"], []),
    ],
)
def test_alloc_conf_parsing(value: str, problems: list[str], unknown: list[str]) -> None:
    found, not_known = alloc_conf_problems(value)
    assert [p.problem for p in found] == problems
    assert not_known == unknown
