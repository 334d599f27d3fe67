"""Inventory checks: what GPUs there are, and whether a driver sees them."""

from __future__ import annotations

from support.facts import finding_keys, make_driver, make_facts, make_gpu_sample
from trainmedic.doctor.checks.inventory import (
    CHECKS,
    check_driver_presence,
    check_fabric,
    check_gpu_inventory,
    check_mixed_models,
    check_persistence_mode,
)
from trainmedic.doctor.facts import MachineFacts
from trainmedic.findings.model import Category, Finding


def run_all(facts: MachineFacts) -> list[Finding]:
    return [f for check in CHECKS for f in check(facts)]


def test_one_info_finding_per_gpu_with_its_facts() -> None:
    facts = make_facts(gpus=[make_gpu_sample(), make_gpu_sample(uuid="GPU-1")])
    findings = check_gpu_inventory(facts)
    assert finding_keys(findings) == {
        ("inventory.gpu", "info", "gpu0"),
        ("inventory.gpu", "info", "gpu1"),
    }
    assert all(f.category is Category.GPU_CAPACITY for f in findings)
    ev = findings[1].evidence
    assert ev["name"] == "NVIDIA H100 80GB HBM3"
    assert ev["uuid"] == "GPU-1"
    assert ev["memory_total_gib"] == 79.6
    assert ev["driver_version"] == "550.54.15"
    assert ev["cuda_driver_version"] == "12.4"
    assert ev["compute_capability"] == "9.0"
    assert ev["persistence_mode"] is True
    assert findings[1].title == "GPU 1: NVIDIA H100 80GB HBM3, 79.6 GiB, compute capability 9.0"


def test_healthy_machine_has_only_inventory_findings() -> None:
    findings = run_all(make_facts(gpus=[make_gpu_sample(), make_gpu_sample()]))
    assert {f.id for f in findings} == {"inventory.gpu"}


def test_no_driver_is_a_single_info_finding_with_the_reason() -> None:
    facts = make_facts(
        gpus=[],
        driver=None,
        absent_reason="no NVIDIA driver: libnvidia-ml.so was not found",
        backend="none",
    )
    findings = run_all(facts)
    assert finding_keys(findings) == {("inventory.no_gpu", "info", "host")}
    (finding,) = findings
    assert finding.category is Category.DRIVER
    assert finding.evidence["reason"] == "no NVIDIA driver: libnvidia-ml.so was not found"
    assert "nvidia-smi" in finding.fix and "--gpus all" in finding.fix


def test_driver_without_gpus_is_a_warning() -> None:
    facts = make_facts(gpus=[], driver=make_driver(version="550.54.15"))
    findings = check_driver_presence(facts)
    assert finding_keys(findings) == {("inventory.driver_without_gpu", "warning", "host")}
    assert findings[0].title == "The NVIDIA driver 550.54.15 is loaded but shows no GPU"
    assert "Xid 79" in findings[0].fix


def test_gpus_present_means_no_presence_finding() -> None:
    assert check_driver_presence(make_facts()) == []


def test_mixed_models_warn_once() -> None:
    a100 = make_gpu_sample(name="NVIDIA A100-SXM4-40GB", compute_capability=(8, 0))
    facts = make_facts(gpus=[make_gpu_sample(), a100, make_gpu_sample()])
    findings = check_mixed_models(facts)
    assert finding_keys(findings) == {("inventory.mixed_gpu_models", "warning", "host")}
    assert findings[0].evidence["models"] == {
        "NVIDIA A100-SXM4-40GB": ["gpu1"],
        "NVIDIA H100 80GB HBM3": ["gpu0", "gpu2"],
    }


def test_persistence_mode_off_is_one_info_finding_listing_gpus() -> None:
    facts = make_facts(
        gpus=[
            make_gpu_sample(persistence_mode=False),
            make_gpu_sample(persistence_mode=True),
            make_gpu_sample(persistence_mode=False),
            make_gpu_sample(persistence_mode=None),  # not supported (e.g. Windows)
        ]
    )
    findings = check_persistence_mode(facts)
    assert finding_keys(findings) == {("driver.persistence_mode_off", "info", "host")}
    assert findings[0].evidence["gpus"] == ["gpu0", "gpu2"]
    assert "nvidia-persistenced" in findings[0].fix


def test_fabric_registration_by_state() -> None:
    facts = make_facts(
        gpus=[
            make_gpu_sample(fabric="completed"),
            make_gpu_sample(fabric=None),  # no NVSwitch: nothing to register
            make_gpu_sample(fabric="in_progress"),
            make_gpu_sample(fabric="failed: Unknown Error (Unknown)"),
            make_gpu_sample(fabric="not_started"),
        ]
    )
    findings = {f.id: f for f in check_fabric(facts)}
    assert {(i, str(f.severity)) for i, f in findings.items()} == {
        ("driver.fabric_registration_pending", "warning"),
        ("driver.fabric_registration_failed", "error"),
        ("driver.fabric_manager_not_running", "error"),
    }
    assert findings["driver.fabric_registration_failed"].evidence["gpus"] == ["gpu3"]
    assert findings["driver.fabric_manager_not_running"].evidence["gpus"] == ["gpu4"]
    assert findings["driver.fabric_registration_pending"].fix.startswith("Wait a minute")
    assert check_fabric(make_facts(gpus=[make_gpu_sample(fabric="completed")])) == []
