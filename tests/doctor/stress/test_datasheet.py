"""The datasheet table: NVML names find their entry, every figure has its source."""

from __future__ import annotations

import pytest

from trainmedic.doctor.stress.datasheet import DATASHEETS, DTYPES, lookup, pcie_gb_per_s


@pytest.mark.parametrize(
    ("nvml_name", "model"),
    [
        ("Tesla V100-SXM2-32GB", "V100 SXM2"),
        ("Tesla V100-PCIE-16GB", "V100 PCIe"),
        ("NVIDIA A100-SXM4-40GB", "A100 SXM4 40GB"),
        ("NVIDIA A100-SXM4-80GB", "A100 SXM4 80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB PCIe"),
        ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA A30", "A30"),
        ("NVIDIA A40", "A40"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 80GB HBM3", "H100 SXM5"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA RTX A6000", "RTX A6000"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
        ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090"),
    ],
)
def test_nvml_names_find_their_model(nvml_name: str, model: str) -> None:
    found = lookup(nvml_name)
    assert found is not None and found.model == model


def test_unknown_model_has_no_entry() -> None:
    assert lookup("NVIDIA GeForce GTX 1080") is None
    assert lookup("NVIDIA A100X") is not None  # an A100 variant still reads as an A100


def test_h200_figures_are_its_datasheets_dense_ones() -> None:
    h200 = lookup("NVIDIA H200")
    assert h200 is not None
    assert dict(h200.tflops) == {
        "fp8": 1979.0,
        "bf16": 989.5,
        "fp16": 989.5,
        "tf32": 494.5,
        "fp32": 67.0,
    }
    assert (h200.memory_gb_per_s, h200.pcie_gen, h200.power_w) == (4800.0, 5, 700.0)
    assert h200.nvlink_gb_per_s == 900.0
    assert "h200" in h200.source.lower() and "https://" in h200.source


def test_every_entry_is_whole_and_sourced() -> None:
    for sheet in DATASHEETS:
        assert sheet.source.count("https://") == 1, sheet.model
        assert set(sheet.tflops) <= set(DTYPES) and "fp32" in sheet.tflops, sheet.model
        assert all(v > 0 for v in sheet.tflops.values())
        # Tensor cores: half precision at least twice FP32 (TF32 or CUDA cores).
        half = sheet.tflops.get("bf16", sheet.tflops.get("fp16", 0))
        assert half >= 2 * sheet.tflops["fp32"] * 0.9, sheet.model
        assert sheet.memory_gb_per_s > 0 and sheet.power_w > 0 and sheet.pcie_gen in (3, 4, 5)
        assert lookup(sheet.model if sheet.model.startswith("GeForce") else f"NVIDIA {sheet.model}")


@pytest.mark.parametrize(
    ("gen", "lanes", "gb_per_s"),
    [
        (3, 16, 15.76),
        (4, 16, 31.504),
        (5, 16, 63.008),
        (4, 8, 15.752),
        (1, 1, 0.25),
        (None, 16, None),
        (5, None, None),
        (9, 16, None),
    ],
)
def test_pcie_link_bandwidth_per_direction(
    gen: int | None, lanes: int | None, gb_per_s: float | None
) -> None:
    assert pcie_gb_per_s(gen, lanes) == gb_per_s
