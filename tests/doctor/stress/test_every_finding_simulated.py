"""Every finding the stress judgment can emit, produced end to end: a simulation file
through ``trainmedic doctor --stress --simulate FILE --json -``, each with its cause,
its GPU and its numbers. (``stress.dcgm.*`` needs ``dcgmi``, which is never run on a
simulated machine: tests/doctor/stress/test_judge.py covers it from a hand-built result.)

At ``--seconds 10`` on one GPU the bursts run: matmuls 0-5.5 s (5 dtypes x 2 bursts of
0.55 s), device copies 5.5-6.5 s, the memory test 6.5-8 s, host copies 8-9 s (4 x 0.25 s);
read every 0.2 s during them: 30 + 6 + 8 + 8 = 52 readings.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from stress_sims import stress_sim, write_sim

from trainmedic.cli.main import main

Finding = dict[str, Any]
ONE_GPU_READINGS = 52
TESTED_BYTES = int(79.5 * 2**30 * 0.8) // 4 * 4
"""80 % of an H100's 80 GiB less the 0.5 GiB in use."""


def run_json(tmp_path: Path, data: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> Any:
    path = write_sim(tmp_path, data)
    code = main(["doctor", "--stress", "--simulate", str(path), "--seconds", "10", "--json", "-"])
    out, err = capsys.readouterr()
    assert code in (0, 1), err
    doc = json.loads(out)
    assert code == (1 if doc["summary"]["error"] else 0)
    return doc


def one(doc: Any, finding_id: str, subject: str) -> Finding:
    found = [f for f in doc["findings"] if f["id"] == finding_id and f["subject"] == subject]
    assert len(found) == 1, [(f["id"], f["subject"]) for f in doc["findings"]]
    return dict(found[0])


def approx(value: float) -> Any:
    return pytest.approx(value, abs=1e-4)


def figures(f: Finding) -> None:
    assert f["evidence"]["tflops"]["bf16"] == 760.0
    assert f["evidence"]["peak_share"]["bf16"] == approx(760 / 989.5)
    assert f["evidence"]["memory_gb_per_s"] == 2950.0
    assert f["evidence"]["host_gb_per_s"]["h2d_pinned"] == 54.0


def below_datasheet(f: Finding) -> None:
    assert f["title"] == (
        "GPU 0 (H100 SXM5) reaches 445 TFLOP/s in bf16, 45 % of its datasheet's 989.5"
    )
    assert f["evidence"]["below_min_share"] == ["bf16"]
    assert f["impact"] == approx(1 - 445 / 989.5 / 0.75)


def slower_than_peers(f: Finding) -> None:
    assert f["evidence"]["dtype"] == "bf16" and f["evidence"]["peers"] == [0]
    assert f["evidence"]["ratio_to_peers"] == approx(650 / 760)
    assert f["impact"] == approx(1 - 650 / 760)


def memory_below(f: Finding) -> None:
    assert f["evidence"]["memory_gb_per_s"] == 1800.0
    assert f["evidence"]["peak_share"] == approx(1800 / 3350)
    assert f["impact"] == approx(1 - 1800 / 3350 / 0.85)


def memory_peers(f: Finding) -> None:
    assert f["title"] == "GPU 1 copies device memory at 2500 GB/s while GPUs 0, 2 reach 2950 GB/s"
    assert f["impact"] == approx(1 - 2500 / 2950)


def host_link(f: Finding) -> None:
    assert f["evidence"]["host_gb_per_s"]["h2d_pinned"] == 30.0
    assert f["evidence"]["link_allows_gb_per_s"] == 63.008
    assert f["impact"] == approx(1 - 30 / 63.008)


def link_degraded(f: Finding) -> None:
    assert f["title"] == "GPU 0's PCIe link ran at Gen4 x16 under load, below its Gen5 x16"
    assert (f["evidence"]["pcie_gen_under_load"], f["evidence"]["pcie_gen_max"]) == (4, 5)


def slow_pair(f: Finding) -> None:
    assert f["evidence"] == {"gb_per_s": 100.0, "pairs_median_gb_per_s": 380.0, "min_ratio": 0.5}
    assert f["impact"] == approx(1 - 100 / 380)


def below_nvlink(f: Finding) -> None:
    assert f["evidence"] == {"gb_per_s": 200.0, "nvlink_one_way_gb_per_s": 450.0, "min_share": 0.5}
    assert f["impact"] == approx(1 - 200 / 450)


def no_datasheet(f: Finding) -> None:
    assert f["evidence"] == {"name": "NVIDIA Mystery Accelerator"}


def no_peer_access(f: Finding) -> None:
    assert f["evidence"] == {"pairs_without_peer_access": [[0, 1], [1, 0]]}
    assert f["title"].startswith("2 of 2 GPU pairs have no peer access")


def dtype_not_measured(f: Finding) -> None:
    assert f["evidence"] == {"not_measured": {"fp8": "torch 2.0 has no float8 matmul"}}


def power_cap(f: Finding) -> None:
    # From second 1 on (46 of the 52 readings) the power cap holds 1500 of 1980 MHz.
    assert f["evidence"]["leading_reason"] == "sw_power_cap"
    assert f["evidence"]["clock_event_shares"] == {"sw_power_cap": approx(46 / 52)}
    assert f["impact"] == approx(1 - (6 + 46 * 1500 / 1980) / 52)


def clock_fell(f: Finding) -> None:
    # From second 3 on: 35 of 52 readings at 1600 MHz, with no reason.
    assert f["title"] == (
        "GPU 0 under load: its SM clock fell from 1980 to 1600 MHz (-19 %), with no clock "
        "event reason reported"
    )
    assert f["evidence"]["clock_event_shares"] == {}
    assert f["impact"] == approx(1 - (17 + 35 * 1600 / 1980) / 52)


def near_slowdown(f: Finding) -> None:
    assert f["evidence"]["margin_c"] == 3.0 and f["evidence"]["temperature_c"]["high"] == 84


def at_slowdown(f: Finding) -> None:
    assert f["evidence"]["margin_c"] == -1.0 and f["evidence"]["temperature_c"]["high"] == 88


def memtest(f: Finding) -> None:
    passes = math.floor(1.5 / (TESTED_BYTES * 5 / 2950e9))
    assert passes == 12
    assert f["evidence"]["errors"] == 2 * passes and f["evidence"]["pages_2mib"] == [2]
    assert f["evidence"]["tested_bytes"] == TESTED_BYTES


def ecc_uncorrectable(f: Finding) -> None:
    assert f["evidence"]["volatile_uncorrected_delta"] == 1


def ecc_corrected(f: Finding) -> None:
    assert f["evidence"]["volatile_corrected_delta"] == 5
    assert f["title"] == "GPU 0 counted 5 corrected ECC error(s) under load"


def together_capacity(f: Finding) -> None:
    assert f["evidence"]["dtype"] == "fp8"
    assert f["evidence"]["tflops_alone"] == 1350.0
    assert f["evidence"]["tflops_together"] == approx(1350 * 0.7)
    assert f["evidence"]["together_share"] == approx(0.7) and f["impact"] == approx(0.3)
    assert f["evidence"]["clock_event_shares"] == {}


def together_thermal(f: Finding) -> None:
    # The power cap from 0.1 to 4.95 s: 29 of GPU 1's 80 readings, all while every GPU ran.
    assert f["evidence"]["together_share"] == approx(0.7)
    assert f["evidence"]["clock_event_shares"] == {"sw_power_cap": approx(29 / 80)}
    assert "power cap active 36 % of the time" in f["title"]


def slow_alone(f: Finding) -> None:
    assert f["title"] == (
        "GPU 1 is slow alone too: 810 TFLOP/s in fp8 with no other GPU running, while GPU 0 "
        "reaches 1350 alone"
    )
    assert f["evidence"]["tflops_alone"] == 810.0
    assert f["evidence"]["peers_median_tflops_alone"] == 1350.0
    assert f["impact"] == approx(1 - 810 / 1350)


SLOW = {"fp8": 810, "bf16": 456, "fp16": 456, "tf32": 234, "fp32": 30.6}
POWER_CAP = {"sm_clock_mhz": 1500, "clock_event_reasons": ["sw_power_cap"]}
CASES: list[tuple[str, dict[str, Any], str, str, str, str, Callable[[Finding], None]]] = [
    ("figures", stress_sim(1), "stress.figures", "gpu0", "info", "gpu_capacity", figures),
    (
        "matmul under the datasheet",
        stress_sim(1, figures={0: {"matmul_tflops": {"bf16": 445, "fp32": 51}}}),
        "stress.matmul_below_datasheet", "gpu0", "warning", "gpu_capacity", below_datasheet,
    ),
    (
        "matmul slower than peers",
        stress_sim(2, figures={1: {"matmul_tflops": {"fp8": 1350, "bf16": 650, "fp32": 51}}}),
        "stress.matmul_slower_than_peers", "gpu1", "warning", "gpu_capacity", slower_than_peers,
    ),
    (
        "memory under the datasheet",
        stress_sim(1, figures={0: {"device_copy_gb_per_s": 1800}}),
        "stress.memory_bandwidth_below_datasheet", "gpu0", "warning", "gpu_capacity",
        memory_below,
    ),
    (
        "memory slower than peers",
        stress_sim(3, figures={1: {"device_copy_gb_per_s": 2500}}),
        "stress.memory_bandwidth_slower_than_peers", "gpu1", "warning", "gpu_capacity",
        memory_peers,
    ),
    (
        "host copies under the link",
        stress_sim(1, figures={0: {"host_gb_per_s": {"h2d_pinned": 30, "d2h_pinned": 53}}}),
        "stress.host_bandwidth_below_link", "gpu0", "warning", "gpu_capacity", host_link,
    ),
    (
        "link degraded under load",
        stress_sim(1, gpus={0: {"pcie": {"gen_current": 4, "gen_max": 5, "gen_gpu_max": 5,
                                         "width_current": 16, "width_max": 16}}}),
        "stress.pcie_link_degraded_under_load", "gpu0", "warning", "hardware_fault",
        link_degraded,
    ),
    (
        "a slow pair",
        stress_sim(3, peers=[[None, 100, 380], [380, None, 380], [380, 380, None]]),
        "stress.peer_bandwidth_slower_than_pairs", "gpu0-gpu1", "warning", "gpu_capacity",
        slow_pair,
    ),
    (
        "pairs under NVLink",
        stress_sim(2, peers=[[None, 200], [200, None]]),
        "stress.peer_bandwidth_below_nvlink", "gpu1-gpu0", "warning", "gpu_capacity",
        below_nvlink,
    ),
    (
        "a model not in the table",
        stress_sim(1, gpus={0: {"name": "NVIDIA Mystery Accelerator"}}),
        "stress.no_datasheet", "gpu0", "info", "gpu_capacity", no_datasheet,
    ),
    (
        "no peer access",
        stress_sim(2, peers=[[None, None], [None, None]]),
        "stress.no_peer_access", "gpus", "warning", "driver", no_peer_access,
    ),
    (
        "a dtype torch cannot run",
        stress_sim(1, figures={0: {
            "matmul_tflops": {"bf16": 760, "fp16": 760, "tf32": 390, "fp32": 51},
            "unsupported": {"fp8": "torch 2.0 has no float8 matmul"}}}),
        "stress.dtype_not_measured", "gpu0", "info", "driver", dtype_not_measured,
    ),
    (
        "a power cap under load",
        stress_sim(1, gpus={0: {"series": [{"t": 1, **POWER_CAP}]}}),
        "stress.throttled_under_load", "gpu0", "warning", "thermal", power_cap,
    ),
    (
        "a clock that falls with no reason",
        stress_sim(1, gpus={0: {"series": [{"t": 3, "sm_clock_mhz": 1600}]}}),
        "stress.clock_fell_under_load", "gpu0", "warning", "thermal", clock_fell,
    ),
    (
        "near the slowdown temperature",
        stress_sim(1, gpus={0: {"series": [{"t": 1, "temperature_c": 84}]}}),
        "stress.temperature_near_slowdown", "gpu0", "warning", "thermal", near_slowdown,
    ),
    (
        "at the slowdown temperature",
        stress_sim(1, gpus={0: {"series": [{"t": 1, "temperature_c": 88}]}}),
        "stress.temperature_at_slowdown", "gpu0", "error", "thermal", at_slowdown,
    ),
    (
        "memory test errors",
        stress_sim(1, figures={0: {"memory_error_offsets": [4194304, 4194308]}}),
        "stress.memory_test_errors", "gpu0", "error", "hardware_fault", memtest,
    ),
    (
        "an uncorrectable ECC error",
        stress_sim(1, gpus={0: {"series": [{"t": 2, "ecc": {"volatile_uncorrected": 1}}]}}),
        "stress.ecc_errors_under_load", "gpu0", "error", "hardware_fault", ecc_uncorrectable,
    ),
    (
        "corrected ECC errors",
        stress_sim(1, gpus={0: {"series": [{"t": 2, "ecc": {"volatile_corrected": 5}}]}}),
        "stress.ecc_errors_under_load", "gpu0", "warning", "hardware_fault", ecc_corrected,
    ),
    (
        "slower together, no reason",
        stress_sim(2, figures={1: {"matmul_together_share": 0.7}}),
        "stress.matmul_slower_together", "gpu1", "warning", "gpu_capacity", together_capacity,
    ),
    (
        "slower together, power capped",
        stress_sim(
            2,
            gpus={1: {"series": [{"t": 0.1, "sm_clock_mhz": 1600,
                                  "clock_event_reasons": ["sw_power_cap"]},
                                 {"t": 4.95, "sm_clock_mhz": 1980, "clock_event_reasons": []}]}},
            figures={1: {"matmul_together_share": 0.7, "follows_sm_clock": False}},
        ),
        "stress.matmul_slower_together", "gpu1", "warning", "thermal", together_thermal,
    ),
    (
        "slow alone too",
        stress_sim(2, figures={1: {"matmul_tflops": SLOW}}),
        "stress.matmul_slow_alone", "gpu1", "warning", "gpu_capacity", slow_alone,
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("data", "finding_id", "subject", "severity", "category", "check"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_each_finding_comes_out_of_a_simulated_run(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    data: dict[str, Any],
    finding_id: str,
    subject: str,
    severity: str,
    category: str,
    check: Callable[[Finding], None],
) -> None:
    doc = run_json(tmp_path, data, capsys)
    f = one(doc, finding_id, subject)
    assert (f["severity"], f["category"]) == (severity, category)
    check(f)


def test_one_gpu_is_read_52_times_during_its_bursts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = run_json(tmp_path, stress_sim(1), capsys)
    (g,) = doc["context"]["stress"]["gpus"]
    assert g["readings"]["samples"] == ONE_GPU_READINGS
    assert g["tflops_alone"] == {} and doc["context"]["stress"]["elapsed_s"] == 9.0


def test_every_finding_id_the_judgment_knows_has_a_simulated_case() -> None:
    from trainmedic.doctor.stress import judge, judge_health, judge_together

    sources = "".join(
        Path(m.__file__).read_text() for m in (judge, judge_health, judge_together) if m.__file__
    )
    import re

    emitted = set(re.findall(r'"(stress\.[a-z_]+)"', sources)) - {"stress.dcgm"}
    covered = {case[2] for case in CASES}
    assert emitted - covered == set(), "findings without a simulated case"
