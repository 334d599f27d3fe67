"""``doctor --stress`` on a real NVIDIA GPU through torch.cuda (a few seconds per GPU).

Run by ``scripts/gpu-check`` (``pytest -m gpu``); elsewhere these tests skip
(tests/conftest.py). The bounds are wide: they catch a wrong unit or a broken timer (a
figure 1000x off, or over the datasheet's peak), not a slow GPU.
"""

from __future__ import annotations

import time

import pytest

from support.real_gpu import nvml_backend_fixture
from trainmedic.doctor.stress.judge import judge_stress
from trainmedic.doctor.stress.results import StressResult
from trainmedic.doctor.stress.runner import StressPlan, run_stress
from trainmedic.doctor.stress.torch_machine import open_torch_machine
from trainmedic.gpu.backend import GpuBackend

pytestmark = pytest.mark.gpu


backend = nvml_backend_fixture()


@pytest.fixture(scope="module")
def result(backend: GpuBackend) -> StressResult:
    return run_stress(
        StressPlan(gpus=(0,), seconds=4.0, memtest_share=0.5, force=True),
        backend,
        open_torch_machine,
        time.monotonic,
    )


def test_matmul_figures_are_real_and_under_the_peak(result: StressResult) -> None:
    (g,) = result.gpus
    assert g.tflops, g.not_measured
    for dtype, rate in g.tflops.items():
        assert rate.mean > 1.0, (dtype, rate)
        share = g.peak_share(dtype)
        if share is not None:
            assert 0.05 < share < 1.05, (dtype, rate.mean, share)
    assert "fp32" in g.tflops and "fp16" in g.tflops


def test_copies_and_memory_test(result: StressResult) -> None:
    (g,) = result.gpus
    assert g.memory_gb_per_s is not None and g.memory_gb_per_s.mean > 50
    if g.datasheet is not None:
        assert g.memory_gb_per_s.mean < 1.05 * g.datasheet.memory_gb_per_s
    assert g.memtest is not None and g.memtest.errors == 0 and g.memtest.passes >= 1
    assert g.memtest.tested_bytes > 1 << 30
    pinned, pageable = g.host_gb_per_s["h2d_pinned"].mean, g.host_gb_per_s["h2d_pageable"].mean
    assert 1.0 < pinned < 130 and 0.2 < pageable < 130


def test_readings_and_findings(result: StressResult) -> None:
    (g,) = result.gpus
    # Read every 0.2 s during the bursts (about 4 s of them), not once between two.
    assert g.readings.sample_period_s == 0.2 and g.readings.samples >= 12
    assert g.tflops_alone == {}  # one GPU: all at once was alone
    assert g.readings.power_w is not None and g.readings.power_w.high > 0
    findings = judge_stress(result)
    assert any(f.id == "stress.figures" for f in findings)
    assert not [f for f in findings if f.id == "stress.memory_test_errors"]
