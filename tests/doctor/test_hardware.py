"""Hardware-fault checks: ECC, page retirement, row remapping, PCIe link."""

from __future__ import annotations

import pytest

from support.facts import finding_keys, make_facts, make_gpu_sample, make_loaded_gpu_sample
from trainmedic.doctor.checks.hardware import CHECKS, check_memory_errors, check_pcie_link
from trainmedic.gpu.types import EccCounts, PcieLink, RemappedRows


def test_healthy_gpus_give_no_hardware_finding() -> None:
    facts = make_facts(gpus=[make_gpu_sample(), make_loaded_gpu_sample()])
    assert [f for check in CHECKS for f in check(facts)] == []


def test_unsupported_readings_stay_quiet() -> None:
    # A GeForce card: no ECC, no row remapping, no page retirement, no PCIe info.
    gpu = make_gpu_sample(
        ecc=EccCounts(),
        retired_pages_pending=None,
        remapped_rows=RemappedRows(),
        pcie=PcieLink(),
    )
    facts = make_facts(gpus=[gpu])
    assert [f for check in CHECKS for f in check(facts)] == []


def test_volatile_uncorrectable_ecc_is_an_error() -> None:
    gpu = make_gpu_sample(
        ecc=EccCounts(
            volatile_corrected=3,
            volatile_uncorrected=2,
            aggregate_corrected=40,
            aggregate_uncorrected=2,
        )
    )
    findings = check_memory_errors(make_facts(gpus=[make_gpu_sample(), gpu]))
    # The lifetime count includes these two errors: no separate aggregate finding.
    assert finding_keys(findings) == {("hardware.ecc.volatile_uncorrectable", "error", "gpu1")}
    (finding,) = findings
    assert finding.evidence["ecc_volatile_uncorrected"] == 2
    assert "nvidia-smi -r -i 1" in finding.fix


def test_volatile_corrected_errors_alone_are_not_reported() -> None:
    gpu = make_gpu_sample(
        ecc=EccCounts(
            volatile_corrected=120,
            volatile_uncorrected=0,
            aggregate_corrected=5000,
            aggregate_uncorrected=0,
        )
    )
    assert check_memory_errors(make_facts(gpus=[gpu])) == []


def test_past_uncorrectable_errors_only_are_info() -> None:
    gpu = make_gpu_sample(ecc=EccCounts(0, 0, 10, 1))
    findings = check_memory_errors(make_facts(gpus=[gpu]))
    assert finding_keys(findings) == {("hardware.ecc.aggregate_uncorrectable", "info", "gpu0")}


def test_pending_page_retirement_is_a_warning() -> None:
    findings = check_memory_errors(make_facts(gpus=[make_gpu_sample(retired_pages_pending=True)]))
    assert finding_keys(findings) == {("hardware.retired_pages_pending", "warning", "gpu0")}


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (RemappedRows(0, 1, True, False), {("hardware.remapped_rows_pending", "warning", "gpu0")}),
        (RemappedRows(0, 8, False, True), {("hardware.remapped_rows_failed", "error", "gpu0")}),
        (
            RemappedRows(0, 8, True, True),
            {
                ("hardware.remapped_rows_pending", "warning", "gpu0"),
                ("hardware.remapped_rows_failed", "error", "gpu0"),
            },
        ),
        # Rows remapped in the past and applied: healthy.
        (RemappedRows(2, 1, False, False), set()),
    ],
)
def test_row_remapping(rows: RemappedRows, expected: set[tuple[str, str, str]]) -> None:
    assert (
        finding_keys(check_memory_errors(make_facts(gpus=[make_gpu_sample(remapped_rows=rows)])))
        == expected
    )


def test_narrow_link_is_a_warning_even_when_idle() -> None:
    gpu = make_gpu_sample(
        pcie=PcieLink(gen_current=1, gen_max=4, gen_gpu_max=4, width_current=8, width_max=16)
    )
    findings = check_pcie_link(make_facts(gpus=[gpu]))
    assert finding_keys(findings) == {("hardware.pcie.width_degraded", "warning", "gpu0")}
    (finding,) = findings
    assert finding.evidence["pcie_width_current_lanes"] == 8
    assert finding.evidence["pcie_width_max_lanes"] == 16
    assert "x8 of x16" in finding.title and "50%" in finding.title


def test_low_link_generation_counts_only_under_load() -> None:
    slow_link = PcieLink(gen_current=3, gen_max=5, gen_gpu_max=5, width_current=16, width_max=16)
    idle = make_gpu_sample(pcie=slow_link, utilization_gpu_pct=0.0)
    busy = make_loaded_gpu_sample(pcie=slow_link)
    findings = check_pcie_link(make_facts(gpus=[idle, busy]))
    assert finding_keys(findings) == {("hardware.pcie.gen_degraded", "warning", "gpu1")}


def test_slot_slower_than_gpu_is_a_warning() -> None:
    gpu = make_gpu_sample(
        pcie=PcieLink(gen_current=1, gen_max=3, gen_gpu_max=4, width_current=16, width_max=16)
    )
    findings = check_pcie_link(make_facts(gpus=[gpu]))
    assert finding_keys(findings) == {("hardware.pcie.slot_below_gpu_max", "warning", "gpu0")}
    assert "Gen4" in findings[0].title and "Gen3" in findings[0].title


def test_unreachable_gpu_is_an_error() -> None:
    from trainmedic.doctor.checks.hardware import check_unreachable

    lost = make_gpu_sample(index=1, unreachable="GPU is lost")
    found = check_unreachable(make_facts(gpus=[make_gpu_sample(), lost]))
    assert [(f.id, f.severity.value, f.subject) for f in found] == [
        ("hardware.gpu_unreachable", "error", "gpu1")
    ]
    assert check_unreachable(make_facts(gpus=[make_gpu_sample()])) == []
