"""Driver checks: torch's CUDA build against the driver and the GPUs."""

from __future__ import annotations

import pytest

from support.facts import (
    finding_keys,
    make_driver,
    make_facts,
    make_gpu_sample,
    make_host_facts,
    make_torch_build,
)
from trainmedic.doctor.checks.driver import (
    CHECKS,
    check_cuda_runtime,
    check_gpu_architecture,
    check_torch_cuda_build,
    check_torch_installed,
)
from trainmedic.doctor.facts import MachineFacts
from trainmedic.findings.model import Finding


def run_all(facts: MachineFacts) -> list[Finding]:
    return [f for check in CHECKS for f in check(facts)]


def test_matching_build_on_h100_is_quiet() -> None:
    assert run_all(make_facts()) == []


def test_no_gpu_machine_is_quiet_even_with_cpu_torch() -> None:
    facts = make_facts(gpus=[], driver=None, torch=make_torch_build(cuda_version=None))
    assert run_all(facts) == []


def test_torch_missing_on_gpu_machine_is_info_only() -> None:
    findings = run_all(make_facts(torch=None))
    assert finding_keys(findings) == {("driver.torch_not_installed", "info", "host")}
    assert check_torch_installed(make_facts(gpus=[], driver=None, torch=None)) == []


def test_cpu_only_torch_on_gpu_machine_is_an_error_with_matching_wheel() -> None:
    facts = make_facts(
        torch=make_torch_build(version="2.4.0+cpu", cuda_version=None, arch_list=()),
        driver=make_driver(cuda_version=(12, 2)),
    )
    (finding,) = check_torch_cuda_build(facts)
    assert (finding.id, finding.severity.value) == ("driver.torch_cpu_only", "error")
    # The newest wheel a 12.2 driver runs natively is cu121.
    assert "https://download.pytorch.org/whl/cu121" in finding.fix


@pytest.mark.parametrize(
    ("torch_cuda", "driver_cuda", "expected"),
    [
        ((12, 4), (12, 4), set()),
        ((12, 1), (12, 4), set()),  # older toolkit on a newer driver: fine
        ((11, 8), (12, 2), set()),
        ((12, 4), (12, 2), {("driver.cuda_minor_newer_than_driver", "warning", "host")}),
        ((12, 4), (11, 8), {("driver.cuda_newer_than_driver", "error", "host")}),
        ((13, 0), (12, 8), {("driver.cuda_newer_than_driver", "error", "host")}),
    ],
)
def test_torch_cuda_against_driver_cuda(
    torch_cuda: tuple[int, int],
    driver_cuda: tuple[int, int],
    expected: set[tuple[str, str, str]],
) -> None:
    facts = make_facts(
        torch=make_torch_build(cuda_version=torch_cuda),
        driver=make_driver(cuda_version=driver_cuda),
    )
    assert finding_keys(check_torch_cuda_build(facts)) == expected


def test_major_mismatch_fix_names_driver_branch_and_wheel() -> None:
    facts = make_facts(
        torch=make_torch_build(version="2.4.0+cu124", cuda_version=(12, 4)),
        driver=make_driver(version="520.61.05", cuda_version=(11, 8)),
    )
    (finding,) = check_torch_cuda_build(facts)
    assert "550 branch or newer" in finding.fix
    assert "https://download.pytorch.org/whl/cu118" in finding.fix
    assert finding.evidence == {
        "torch_version": "2.4.0+cu124",
        "torch_cuda_version": "12.4",
        "driver_version": "520.61.05",
        "driver_cuda_version": "11.8",
    }


def test_old_driver_gets_same_major_wheel_through_minor_version_compatibility() -> None:
    facts = make_facts(
        torch=make_torch_build(version="2.4.0+cu121", cuda_version=(12, 1)),
        driver=make_driver(version="470.223.02", cuda_version=(11, 4)),
    )
    (finding,) = check_torch_cuda_build(facts)
    assert "530 branch or newer" in finding.fix
    assert "whl/cu118, " not in finding.fix
    assert "CUDA 11.8, which this driver runs through minor-version compatibility" in finding.fix


def test_minor_mismatch_fix_names_driver_branch() -> None:
    facts = make_facts(
        torch=make_torch_build(cuda_version=(12, 8)), driver=make_driver(cuda_version=(12, 2))
    )
    (finding,) = check_torch_cuda_build(facts)
    assert "570 branch or newer" in finding.fix
    assert "whl/cu121" in finding.fix


def test_unknown_driver_cuda_version_is_quiet() -> None:
    facts = make_facts(driver=make_driver(cuda_version=None))
    assert check_torch_cuda_build(facts) == []


def test_blackwell_gpu_missing_from_cu124_build_is_an_error() -> None:
    rtx = make_gpu_sample(name="NVIDIA GeForce RTX 5090", compute_capability=(12, 0))
    facts = make_facts(gpus=[rtx, rtx], driver=make_driver(version="570.86", cuda_version=(12, 8)))
    findings = check_gpu_architecture(facts)
    assert finding_keys(findings) == {("driver.gpu_arch_unsupported", "error", "gpu0,gpu1")}
    (finding,) = findings
    assert finding.evidence["gpu_arch"] == "sm_120"
    assert finding.evidence["gpus"] == ["gpu0", "gpu1"]
    # The driver already supports 12.8: only torch has to change.
    assert "pip install --upgrade torch --index-url https://download.pytorch.org/whl/cu128" in (
        finding.fix
    )
    assert "upgrade the NVIDIA driver" not in finding.fix


def test_new_gpu_with_old_driver_needs_driver_upgrade_first() -> None:
    b200 = make_gpu_sample(name="NVIDIA B200", compute_capability=(10, 0))
    facts = make_facts(gpus=[b200], driver=make_driver(cuda_version=(12, 4)))
    (finding,) = check_gpu_architecture(facts)
    assert "upgrade the NVIDIA driver to the 570 branch or newer" in finding.fix


def test_gpu_older_than_the_build_suggests_older_torch() -> None:
    k80 = make_gpu_sample(name="Tesla K80", compute_capability=(3, 7))
    (finding,) = check_gpu_architecture(make_facts(gpus=[k80]))
    assert finding.id == "driver.gpu_arch_unsupported"
    assert "older torch release" in finding.fix
    assert "TORCH_CUDA_ARCH_LIST=3.7" in finding.fix


@pytest.mark.parametrize(
    ("arch_list", "capability"),
    [
        (("sm_80",), (8, 6)),  # cubins run on a newer minor of the same major
        (("sm_80",), (8, 9)),
        (("sm_80", "sm_90"), (9, 0)),
        (("sm_90a", "sm_80"), (8, 0)),
    ],
)
def test_binary_compatible_architectures_are_quiet(
    arch_list: tuple[str, ...], capability: tuple[int, int]
) -> None:
    facts = make_facts(
        gpus=[make_gpu_sample(compute_capability=capability)],
        torch=make_torch_build(arch_list=arch_list),
    )
    assert check_gpu_architecture(facts) == []


@pytest.mark.parametrize(
    ("arch_list", "capability", "expected_id"),
    [
        (("sm_80",), (9, 0), "driver.gpu_arch_unsupported"),  # no cubin across majors
        (("sm_86",), (8, 0), "driver.gpu_arch_unsupported"),  # nor to an older minor
        (("sm_90a",), (9, 1), "driver.gpu_arch_unsupported"),  # arch-specific: exact only
        (("sm_80", "compute_80"), (9, 0), "driver.gpu_arch_ptx_only"),  # PTX JITs forward
        (("sm_80", "compute_90"), (12, 0), "driver.gpu_arch_ptx_only"),
    ],
)
def test_architecture_rules(
    arch_list: tuple[str, ...], capability: tuple[int, int], expected_id: str
) -> None:
    facts = make_facts(
        gpus=[make_gpu_sample(compute_capability=capability)],
        torch=make_torch_build(arch_list=arch_list),
    )
    (finding,) = check_gpu_architecture(facts)
    assert finding.id == expected_id


def test_ptx_only_warning_mentions_jit_cache() -> None:
    facts = make_facts(
        gpus=[make_gpu_sample(compute_capability=(9, 0))],
        torch=make_torch_build(arch_list=("sm_80", "compute_80")),
    )
    (finding,) = check_gpu_architecture(facts)
    assert finding.severity.value == "warning"
    assert "CUDA_CACHE_MAXSIZE" in finding.fix


def test_architecture_check_is_quiet_when_torch_was_not_imported() -> None:
    facts = make_facts(
        gpus=[make_gpu_sample(compute_capability=(12, 0))],
        torch=make_torch_build(arch_list=(), probed=False, cuda_available=False),
    )
    assert run_all(facts) == []


def test_cudnn_unavailable_is_a_warning() -> None:
    facts = make_facts(torch=make_torch_build(cudnn_available=False, cudnn_version=None))
    assert finding_keys(check_cuda_runtime(facts)) == {
        ("driver.cudnn_unavailable", "warning", "host")
    }


def test_cudnn_unknown_when_not_probed_is_quiet() -> None:
    facts = make_facts(
        torch=make_torch_build(
            probed=False, arch_list=(), cudnn_available=False, cuda_available=False
        )
    )
    assert check_cuda_runtime(facts) == []


def test_cuda_unavailable_names_hiding_cuda_visible_devices() -> None:
    facts = make_facts(
        torch=make_torch_build(cuda_available=False),
        host=make_host_facts(env={"CUDA_VISIBLE_DEVICES": ""}),
    )
    (finding,) = check_cuda_runtime(facts)
    assert (finding.id, finding.severity.value) == ("driver.torch_cuda_unavailable", "error")
    assert "hides every GPU" in finding.fix
    assert finding.evidence["CUDA_VISIBLE_DEVICES"] == ""


def test_cuda_unavailable_explained_by_driver_is_reported_once() -> None:
    facts = make_facts(
        torch=make_torch_build(cuda_available=False, cuda_version=(12, 4)),
        driver=make_driver(cuda_version=(11, 8)),
    )
    assert finding_keys(run_all(facts)) == {("driver.cuda_newer_than_driver", "error", "host")}
