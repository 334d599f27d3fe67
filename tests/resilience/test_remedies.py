"""Remedies: pure transforms of the next attempt's environment, each with its reason."""

from __future__ import annotations

from typing import Any

import pytest

from trainmedic.findings.model import Category
from trainmedic.remedy_api import (
    GRAD_ACCUM_ENV,
    MAX_NUM_WORKERS_ENV,
    MICRO_BATCH_DIVISOR_ENV,
    SHARING_STRATEGY_ENV,
)
from trainmedic.resilience.classify import Classification, FailureClass, GpuRef
from trainmedic.resilience.remedies import (
    Remedy,
    apply_remedies,
    exclude_gpu,
    plan_remedies,
)

# ---------------------------------------------------------------- builders

INVENTORY = (
    GpuRef(index=0, uuid="GPU-aaaa0000", pci_bus_id="0000:1b:00.0"),
    GpuRef(index=1, uuid="GPU-bbbb1111", pci_bus_id="0000:3b:00.0"),
    GpuRef(index=2, uuid="GPU-cccc2222", pci_bus_id="0000:5e:00.0"),
    GpuRef(index=3, uuid="GPU-dddd3333", pci_bus_id="0000:86:00.0"),
)


def make_classification(
    fc: FailureClass, gpu: GpuRef | None = None, **details: Any
) -> Classification:
    return Classification(
        failure_class=fc,
        category=Category.TIMEOUT,
        confidence="high",
        why=f"{fc.value} seen",
        details=details,
        gpu=gpu,
    )


def names(remedies: list[Remedy]) -> list[str]:
    return [r.name for r in remedies]


def next_env(c: Classification, env: dict[str, str], **kwargs: Any) -> dict[str, str]:
    return apply_remedies(env, plan_remedies(c, env, **kwargs))


# ------------------------------------------------------------------ CUDA OOM


def test_oom_halves_the_micro_batch_and_escalates() -> None:
    oom = make_classification(FailureClass.CUDA_OOM)
    env: dict[str, str] = {"HOME": "/root"}
    divisors = []
    for _ in range(5):
        env = next_env(oom, env)
        divisors.append((env[MICRO_BATCH_DIVISOR_ENV], env[GRAD_ACCUM_ENV]))
    assert divisors == [("2", "2"), ("4", "4"), ("8", "8"), ("16", "16"), ("16", "16")]
    assert env["HOME"] == "/root"
    assert "micro_batch" not in names(plan_remedies(oom, env))  # at the cap: nothing more


def test_oom_reason_names_the_evidence() -> None:
    oom = make_classification(FailureClass.CUDA_OOM, reserved_unallocated_bytes=3 * 2**30)
    remedies = plan_remedies(oom, {})
    assert names(remedies) == ["micro_batch", "expandable_segments"]
    assert "divided by 2 with 2x gradient accumulation" in remedies[0].reason
    assert "3072 MiB was reserved but unallocated" in remedies[1].reason
    assert remedies[0].log_line.startswith(
        f"remedy micro_batch: {MICRO_BATCH_DIVISOR_ENV}=2, {GRAD_ACCUM_ENV}=2 — cuda_oom seen"
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}),
        (
            {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,garbage_collection_threshold:0.6"},
            {
                "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,garbage_collection_threshold:0.6,"
                "expandable_segments:True"
            },
        ),
        (
            {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,"},
            {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"},
        ),
        (
            {"PYTORCH_ALLOC_CONF": "pinned_use_background_threads:True"},
            {"PYTORCH_ALLOC_CONF": "pinned_use_background_threads:True,expandable_segments:True"},
        ),
    ],
)
def test_expandable_segments_merge_into_the_existing_setting(
    env: dict[str, str], expected: dict[str, str]
) -> None:
    out = next_env(make_classification(FailureClass.CUDA_OOM), env)
    for key, value in expected.items():
        assert out[key] == value
    conf_keys = {k for k in out if k.endswith("ALLOC_CONF")}
    assert conf_keys == set(expected)


@pytest.mark.parametrize(
    "env",
    [
        {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"},  # the user's choice
        {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
        {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
        {"PYTORCH_ALLOC_CONF": "expandable_segments:True"},
    ],
)
def test_expandable_segments_left_alone_when_already_decided(env: dict[str, str]) -> None:
    remedies = plan_remedies(make_classification(FailureClass.CUDA_OOM), env)
    assert names(remedies) == ["micro_batch"]


def test_expandable_segments_need_torch_2_1() -> None:
    oom = make_classification(FailureClass.CUDA_OOM)
    assert names(plan_remedies(oom, {}, torch_version="2.0.1+cu118")) == ["micro_batch"]
    assert "expandable_segments" in names(plan_remedies(oom, {}, torch_version="2.4.0"))


# --------------------------------------------------------------- data loading


def test_shared_memory_worker_death_halves_the_workers() -> None:
    c = make_classification(FailureClass.DATALOADER_WORKER_DIED, cause="shm", num_workers=8)
    env: dict[str, str] = {}
    caps = []
    for _ in range(5):
        env = next_env(c, env)
        caps.append(env.get(MAX_NUM_WORKERS_ENV))
    assert caps == ["4", "2", "1", "0", "0"]
    remedy = plan_remedies(c, {})[0]
    assert "shared memory (/dev/shm) ran out" in remedy.reason
    assert "(was 8)" in remedy.reason


def test_worker_count_unknown_caps_at_two() -> None:
    c = make_classification(FailureClass.DATALOADER_WORKER_DIED, cause="shm")
    assert next_env(c, {})[MAX_NUM_WORKERS_ENV] == "2"


def test_file_descriptor_exhaustion_switches_the_sharing_strategy() -> None:
    c = make_classification(FailureClass.DATALOADER_WORKER_DIED, cause="fd_limit")
    env = next_env(c, {})
    assert env[SHARING_STRATEGY_ENV] == "file_system"
    assert plan_remedies(c, env) == []


def test_crashing_worker_gets_no_remedy() -> None:
    c = make_classification(FailureClass.DATALOADER_WORKER_DIED, cause="crashed", num_workers=4)
    assert plan_remedies(c, {}) == []


def test_host_oom_with_workers_lowers_them_and_without_does_nothing() -> None:
    with_workers = make_classification(FailureClass.HOST_OOM_KILL, num_workers=6)
    assert next_env(with_workers, {})[MAX_NUM_WORKERS_ENV] == "3"
    assert plan_remedies(make_classification(FailureClass.HOST_OOM_KILL), {}) == []


# --------------------------------------------------------------------- GPUs


def test_faulty_gpu_is_excluded_by_uuid_when_all_were_visible() -> None:
    fault = make_classification(
        FailureClass.CUDA_ERROR, gpu=GpuRef(pci_bus_id="0000:3b:00.0"), hardware=True, xid=79
    )
    env = next_env(fault, {}, gpus=INVENTORY)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-aaaa0000,GPU-cccc2222,GPU-dddd3333"
    assert "CUDA_DEVICE_ORDER" not in env


def test_faulty_gpu_is_removed_from_an_index_list() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "2,3"}
    remedy = exclude_gpu(GpuRef(index=3), env, INVENTORY, why="Xid 48")
    assert remedy is not None
    assert remedy.apply(env)["CUDA_VISIBLE_DEVICES"] == "GPU-cccc2222"
    assert remedy.reason.startswith("Xid 48: gpu3 is left out")


def test_index_list_without_inventory_keeps_indexes_in_pci_order() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2"}
    remedy = exclude_gpu(GpuRef(index=1), env, ())
    assert remedy is not None
    assert remedy.set_env == {"CUDA_VISIBLE_DEVICES": "0,2", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def test_uuid_prefixes_in_the_environment_are_matched() -> None:
    env = {"CUDA_VISIBLE_DEVICES": "GPU-aaaa,GPU-bbbb"}
    remedy = exclude_gpu(GpuRef(pci_bus_id="00000000:1B:00.0"), env, INVENTORY)
    assert remedy is not None
    assert remedy.apply(env)["CUDA_VISIBLE_DEVICES"] == "GPU-bbbb1111"


@pytest.mark.parametrize(
    ("env", "faulty", "gpus"),
    [
        ({"CUDA_VISIBLE_DEVICES": "1"}, GpuRef(index=1), INVENTORY),  # the only GPU
        ({"CUDA_VISIBLE_DEVICES": "0,2"}, GpuRef(index=1), INVENTORY),  # not one of ours
        ({}, GpuRef(index=1), ()),  # all visible, but how many is unknown
        ({"CUDA_VISIBLE_DEVICES": "MIG-1234,MIG-5678"}, GpuRef(index=0), INVENTORY),
        ({"CUDA_VISIBLE_DEVICES": "0,1"}, GpuRef(pci_bus_id="0000:3b:00.0"), ()),  # unmappable
    ],
)
def test_exclusion_impossible_leaves_the_environment_alone(
    env: dict[str, str], faulty: GpuRef, gpus: tuple[GpuRef, ...]
) -> None:
    assert exclude_gpu(faulty, env, gpus) is None


def test_cuda_error_without_hardware_evidence_excludes_nothing() -> None:
    c = make_classification(FailureClass.CUDA_ERROR, gpu=GpuRef(index=0))
    assert plan_remedies(c, {}, gpus=INVENTORY) == []


# ------------------------------------------------------------------ others


def test_collective_timeout_turns_on_nccl_warnings_once() -> None:
    c = make_classification(FailureClass.COLLECTIVE_TIMEOUT)
    env = next_env(c, {})
    assert env["NCCL_DEBUG"] == "WARN"
    assert plan_remedies(c, {"NCCL_DEBUG": "INFO"}) == []


@pytest.mark.parametrize(
    "fc", [FailureClass.HANG, FailureClass.USER_EXCEPTION, FailureClass.SEGFAULT]
)
def test_classes_without_a_remedy(fc: FailureClass) -> None:
    assert plan_remedies(make_classification(fc), {}) == []


def test_remedy_can_unset_and_never_mutates_its_input() -> None:
    remedy = Remedy("x", "because", {"A": "1"}, ("B",))
    env = {"B": "2", "C": "3"}
    assert remedy.apply(env) == {"A": "1", "C": "3"}
    assert env == {"B": "2", "C": "3"}
    assert remedy.log_line == "remedy x: A=1, unset B — because"
