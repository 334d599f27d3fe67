"""The findings the example machines do not raise, from hand-built results."""

from __future__ import annotations

import pytest
from stress_builders import make_gpu, make_readings, make_result, rate

from trainmedic.doctor.stress.dcgm import DcgmOutcome, DcgmVerdict
from trainmedic.doctor.stress.judge import (
    check_figures,
    check_matmul_datasheet,
    check_memory_bandwidth,
    gpu_list,
    judge_stress,
)
from trainmedic.doctor.stress.judge_health import (
    check_dcgm,
    check_ecc,
    check_temperature,
    check_throttling,
)
from trainmedic.doctor.stress.results import Drift, GpuStress
from trainmedic.findings.model import Finding
from trainmedic.gpu.types import EccCounts


def ids(findings: list[Finding]) -> list[tuple[str, str, str | None]]:
    return [(f.id, f.severity.value, f.subject) for f in findings]


def test_a_healthy_gpu_gives_only_its_figures() -> None:
    assert ids(judge_stress(make_result())) == [("stress.figures", "info", "gpu0")]


def test_matmul_under_half_the_datasheet() -> None:
    low = make_gpu(tflops={"bf16": rate(445.0), "fp32": rate(51.0)})
    (f,) = check_matmul_datasheet(make_result(low))
    assert f.id == "stress.matmul_below_datasheet" and f.severity.value == "warning"
    assert f.title == "GPU 0 (H100 SXM5) reaches 445 TFLOP/s in bf16, 45 % of its datasheet's 989.5"
    assert f.evidence["below_min_share"] == ["bf16"]
    assert f.impact == pytest.approx(1 - (445 / 989.5) / 0.75, abs=1e-4)
    # At 50 % exactly it is not below.
    assert check_matmul_datasheet(make_result(make_gpu(tflops={"bf16": rate(494.75)}))) == []


def test_memory_bandwidth_against_datasheet_and_peers() -> None:
    slow = make_gpu(1, memory_gb_per_s=rate(1900.0))
    found = {
        (f.id, f.subject): f
        for f in check_memory_bandwidth(make_result(make_gpu(0), slow, make_gpu(2)))
    }
    assert set(found) == {
        ("stress.memory_bandwidth_below_datasheet", "gpu1"),
        ("stress.memory_bandwidth_slower_than_peers", "gpu1"),
    }
    below = found[("stress.memory_bandwidth_below_datasheet", "gpu1")]
    assert below.evidence["peak_share"] == pytest.approx(1900 / 3350, abs=1e-4)
    peers = found[("stress.memory_bandwidth_slower_than_peers", "gpu1")]
    assert peers.title == "GPU 1 copies device memory at 1900 GB/s while GPUs 0, 2 reach 2950 GB/s"
    assert peers.impact == pytest.approx(1 - 1900 / 2950, abs=1e-4)


def test_a_clock_that_falls_with_no_reason() -> None:
    falling = make_gpu(
        readings=make_readings(sm_clock_mhz=Drift(1980, 1500, 1500, 1980), mean_clock_ratio=0.85)
    )
    (f,) = check_throttling(make_result(falling))
    assert f.id == "stress.clock_fell_under_load" and f.severity.value == "warning"
    assert "fell from 1980 to 1500 MHz (-24 %)" in f.title
    assert f.impact == pytest.approx(0.15)
    # A fall under 15 % is none; a reason under 10 % of the readings is noise.
    small = make_gpu(
        readings=make_readings(
            sm_clock_mhz=Drift(1980, 1700, 1700, 1980), reason_shares={"hw_power_brake": 0.05}
        )
    )
    assert check_throttling(make_result(small)) == []


def test_a_power_cap_is_a_warning_a_thermal_slowdown_an_error() -> None:
    capped = make_gpu(readings=make_readings(reason_shares={"sw_power_cap": 0.6}))
    hot = make_gpu(1, readings=make_readings(reason_shares={"hw_thermal": 0.2, "hw_slowdown": 0.2}))
    found = {f.subject: f for f in check_throttling(make_result(capped, hot))}
    assert (
        found["gpu0"].severity.value == "warning" and "power cap active 60 %" in found["gpu0"].title
    )
    assert found["gpu1"].severity.value == "error"
    assert "hardware thermal slowdown active 20 %" in found["gpu1"].title


def test_temperature_at_the_slowdown_threshold() -> None:
    at = make_gpu(readings=make_readings(temperature_c=Drift(50, 86, 50, 88)))
    (f,) = check_temperature(make_result(at))
    assert (f.id, f.severity.value) == ("stress.temperature_at_slowdown", "error")
    assert f.title == (
        "GPU 0 heated from 50 to 88 °C under load, at or over its slowdown threshold of 87 °C"
    )
    assert f.evidence["margin_c"] == -1.0
    cool = make_gpu(readings=make_readings(temperature_c=Drift(50, 81, 50, 81.9)))
    assert check_temperature(make_result(cool)) == []


def test_corrected_ecc_errors_are_a_warning() -> None:
    g = make_gpu(ecc_before=EccCounts(3, 0, 10, 0), ecc_after=EccCounts(7, 0, 14, 0))
    (f,) = check_ecc(make_result(g))
    assert (f.severity.value, f.title) == (
        "warning",
        "GPU 0 counted 4 corrected ECC error(s) under load",
    )
    assert check_ecc(make_result(make_gpu(ecc_before=EccCounts(), ecc_after=EccCounts(5)))) == []


def test_dcgm_failures_and_warnings_become_findings() -> None:
    outcome = DcgmOutcome(
        2,
        True,
        None,
        (
            DcgmVerdict("Hardware", "Memory", 0, "Pass"),
            DcgmVerdict("Hardware", "Memory", 1, "Fail", ("DBE errors detected on GPU 1",)),
            DcgmVerdict("Integration", "PCIe", 1, "Warn", ("PCIe replay count 120",)),
            DcgmVerdict("Deployment", "Denylist", None, "Skip"),
        ),
    )
    found = check_dcgm(make_result(dcgm=outcome))
    assert ids(found) == [
        ("stress.dcgm.memory", "error", "gpu1"),
        ("stress.dcgm.pcie", "warning", "gpu1"),
    ]
    assert found[0].title == "dcgmi diag -r 2: Memory failed on GPU 1: DBE errors detected on GPU 1"
    assert check_dcgm(make_result(dcgm=DcgmOutcome(1, False, "dcgmi is not installed"))) == []


def test_an_unknown_model_and_an_unmeasured_dtype_are_information() -> None:
    unknown = make_gpu(name="NVIDIA Quantum X9", datasheet=None)
    no_fp8 = make_gpu(1, not_measured={"fp8": "torch 2.0 has no float8 matmul"})
    found = ids(check_figures(make_result(unknown, no_fp8)))
    assert ("stress.no_datasheet", "info", "gpu0") in found
    assert ("stress.dtype_not_measured", "info", "gpu1") in found
    assert all(sev == "info" for _, sev, _ in found)


@pytest.mark.parametrize(
    ("indices", "text"),
    [([3], "GPU 3"), ([0, 1, 2], "GPUs 0-2"), ([0, 2], "GPUs 0, 2"), ([1, 0], "GPUs 0, 1")],
)
def test_gpu_lists_read_as_words(indices: list[int], text: str) -> None:
    assert gpu_list(indices) == text


def test_pairs_without_peer_access_read_as_arrows_and_stay_pairs_in_json() -> None:
    import io
    import json

    from rich.console import Console

    from trainmedic.doctor.stress.judge import check_peers
    from trainmedic.doctor.stress.results import PeerStress
    from trainmedic.report.html import findings_html
    from trainmedic.report.terminal import render_finding

    gpus = tuple(make_gpu(i) for i in (0, 3))
    peers = (PeerStress(0, 3, None), PeerStress(3, 0, None))
    (f,) = check_peers(make_result(*gpus, peers=peers))
    assert f.id == "stress.no_peer_access"
    assert json.loads(json.dumps(f.evidence)) == {"pairs_without_peer_access": [[0, 3], [3, 0]]}
    out = io.StringIO()
    Console(file=out, width=100, color_system=None).print(render_finding(f, width=100))
    assert "0->3, 3->0" in out.getvalue() and "0; 3" not in out.getvalue()
    page = findings_html([f])
    assert "0-&gt;3, 3-&gt;0" in page and "0; 3" not in page


def test_together_against_alone_edges() -> None:
    from trainmedic.doctor.stress.judge_together import check_matmul_together

    def gpu(index: int, together: float, alone: float | None, **kw: object) -> GpuStress:
        extra = {} if alone is None else {"tflops_alone": {"fp8": rate(alone)}}
        tflops = {"fp8": rate(together), "bf16": rate(760.0)}
        return make_gpu(index, tflops=tflops, **extra, **kw)

    # Exactly at the bar keeps the whole speed together: nothing.
    assert check_matmul_together(make_result(gpu(0, 1215.0, 1350.0), gpu(1, 1350.0, 1350.0))) == []
    # No alone figure (one GPU selected): nothing to compare.
    assert check_matmul_together(make_result(gpu(0, 900.0, None))) == []
    # Slow alone too wins over slower together: one finding, about the GPU itself.
    (f,) = check_matmul_together(make_result(gpu(0, 600.0, 1000.0), gpu(1, 1350.0, 1350.0)))
    assert (f.id, f.subject, f.category.value) == (
        "stress.matmul_slow_alone",
        "gpu0",
        "gpu_capacity",
    )
    # Alone with no same-model peer: judged against the datasheet (1979 fp8 on H100 SXM5).
    odd = gpu(1, 1350.0, 1350.0, name="NVIDIA Other", datasheet=None)
    (f,) = check_matmul_together(make_result(gpu(0, 900.0, 950.0), odd))
    assert f.id == "stress.matmul_slow_alone"
    assert f.title.endswith("48 % of its datasheet's peak")
    assert f.impact == pytest.approx(1 - (950 / 1979) / 0.75, abs=1e-4)
    # A clock that fell under load makes slower-together a thermal finding.
    fell = make_readings(sm_clock_mhz=Drift(1980, 1900, 1500, 1980), mean_clock_ratio=0.9)
    (f,) = check_matmul_together(
        make_result(gpu(0, 1000.0, 1350.0, readings=fell), gpu(1, 1350.0, 1350.0))
    )
    assert (f.id, f.category.value) == ("stress.matmul_slower_together", "thermal")
    assert f.impact == pytest.approx(1 - 1000 / 1350, abs=1e-4)
