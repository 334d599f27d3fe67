"""The datasheet table: NVML names find their entry, every figure has its source."""

from __future__ import annotations

import pytest

from trainmedic.doctor.stress.datasheet import DATASHEETS, DTYPES, lookup, pcie_gb_per_s


@pytest.mark.parametrize(
    ("nvml_name", "model"),
    [
        ("Tesla V100-SXM2-32GB", "V100 SXM2"),
        ("Tesla V100-PCIE-16GB", "V100 PCIe"),
        ("Tesla V100S-PCIE-32GB", "V100S PCIe"),
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
        ("NVIDIA B200", "B200"),
        ("NVIDIA B100", "B100"),
        ("NVIDIA GB200", "GB200"),
        ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", "RTX PRO 6000 Blackwell"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX PRO 6000 Blackwell"),
        ("NVIDIA GeForce RTX 5090", "GeForce RTX 5090"),
    ],
)
def test_nvml_names_find_their_model(nvml_name: str, model: str) -> None:
    found = lookup(nvml_name)
    assert found is not None and found.model == model


def test_unknown_model_has_no_entry() -> None:
    assert lookup("NVIDIA GeForce GTX 1080") is None
    assert lookup("NVIDIA A100X") is not None  # an A100 variant still reads as an A100


@pytest.mark.parametrize(
    "nvml_name",
    [
        "NVIDIA GH200 480GB",  # not an H200: H100-class compute, its own memory and power
        "NVIDIA B300 SXM6 AC",
        "NVIDIA GB300",
        # Lower clocks at 300 W than the Workstation Edition's figures.
        "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition",
        "NVIDIA GeForce RTX 5080",
    ],
)
def test_lookalike_names_do_not_borrow_an_entry(nvml_name: str) -> None:
    assert lookup(nvml_name) is None


def test_b200_is_not_read_inside_gb200() -> None:
    gb200, b200 = lookup("NVIDIA GB200"), lookup("NVIDIA B200")
    assert gb200 is not None and b200 is not None
    assert (gb200.model, b200.model) == ("GB200", "B200")
    assert gb200.tflops["bf16"] > b200.tflops["bf16"]


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


# (NVML name, dtype, the figure the datasheet prints with sparsity): the table holds half.
_SPARSE_AS_PRINTED = [
    ("NVIDIA H100 80GB HBM3", "bf16", 1979.0),
    ("NVIDIA H100 80GB HBM3", "fp8", 3958.0),
    ("NVIDIA H100 80GB HBM3", "tf32", 989.0),
    ("NVIDIA H100 PCIe", "bf16", 1513.0),
    ("NVIDIA H100 PCIe", "fp8", 3026.0),
    ("NVIDIA H100 NVL", "bf16", 1671.0),
    ("NVIDIA H200", "bf16", 1979.0),
    ("NVIDIA H200", "fp8", 3958.0),
    ("NVIDIA H200 NVL", "fp8", 3341.0),
    ("NVIDIA A100-SXM4-80GB", "bf16", 624.0),
    ("NVIDIA A100-SXM4-80GB", "tf32", 312.0),
    ("NVIDIA L4", "fp8", 485.0),
    ("NVIDIA L4", "bf16", 242.0),
    ("NVIDIA L40S", "fp8", 1466.0),
    ("NVIDIA B200", "fp8", 9000.0),
    ("NVIDIA B200", "bf16", 4500.0),
    ("NVIDIA B100", "bf16", 3500.0),
    ("NVIDIA GB200", "fp8", 10000.0),
    ("NVIDIA GB200", "tf32", 2500.0),
]


@pytest.mark.parametrize(("nvml_name", "dtype", "sparse"), _SPARSE_AS_PRINTED)
def test_tensor_figures_are_dense_halves_of_the_sparse_ones(
    nvml_name: str, dtype: str, sparse: float
) -> None:
    sheet = lookup(nvml_name)
    assert sheet is not None
    assert sheet.tflops[dtype] == sparse / 2


def test_corrected_figures() -> None:
    h100, h100_pcie = lookup("NVIDIA H100 80GB HBM3"), lookup("NVIDIA H100 PCIe")
    assert h100 is not None and h100_pcie is not None
    assert (h100.tflops["bf16"], h100.tflops["fp16"]) == (989.5, 989.5)
    assert (h100_pcie.tflops["bf16"], h100_pcie.tflops["fp16"]) == (756.5, 756.5)
    a100 = lookup("NVIDIA A100-SXM4-40GB")
    assert a100 is not None
    assert (a100.tflops["fp32"], a100.memory_gb_per_s, a100.power_w) == (19.5, 1555.0, 400.0)
    v100s = lookup("Tesla V100S-PCIE-32GB")
    assert v100s is not None
    assert (v100s.tflops["fp16"], v100s.tflops["fp32"], v100s.memory_gb_per_s) == (
        130.0,
        16.4,
        1134.0,
    )
    rtx4090 = lookup("NVIDIA GeForce RTX 4090")
    assert rtx4090 is not None and rtx4090.tflops["fp8"] == 330.3  # FP32 accumulate


def test_blackwell_figures() -> None:
    b200 = lookup("NVIDIA B200")
    assert b200 is not None
    assert dict(b200.tflops) == {
        "fp8": 4500.0,
        "bf16": 2250.0,
        "fp16": 2250.0,
        "tf32": 1125.0,
        "fp32": 75.0,
    }
    assert (b200.memory_gb_per_s, b200.power_w, b200.nvlink_gb_per_s) == (7700.0, 1000.0, 1800.0)
    pro = lookup("NVIDIA RTX PRO 6000 Blackwell Workstation Edition")
    assert pro is not None
    assert (pro.tflops["bf16"], pro.tflops["fp32"], pro.memory_gb_per_s, pro.power_w) == (
        500.0,
        125.0,
        1792.0,
        600.0,
    )
    assert pro.nvlink_gb_per_s is None and "not in the datasheet" in pro.note


def test_bridged_boards_are_not_judged_against_nvlink() -> None:
    # A bridge joins some cards only: the other pairs copy over PCIe.
    for name in ("NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA H100 PCIe", "NVIDIA A100-PCIE-40GB"):
        sheet = lookup(name)
        assert sheet is not None and sheet.nvlink_gb_per_s is None, name
        assert "bridge" in sheet.note.lower(), name


def test_tensor_figures_keep_the_ratios_of_their_generation() -> None:
    for sheet in DATASHEETS:
        t = sheet.tflops
        if "bf16" in t:
            assert t["bf16"] == t["fp16"], sheet.model
        # Within 2 %: datasheets round each figure by itself (A30: TF32 82 beside BF16 165),
        # and the L40S's prints TF32 183 and FP8 733 beside BF16 362.05.
        if "tf32" in t:
            assert t["tf32"] == pytest.approx(t["bf16"] / 2, rel=0.02), sheet.model
        if "fp8" in t:
            assert t["fp8"] == pytest.approx(2 * t["bf16"], rel=0.02), sheet.model


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


def test_the_json_entry_carries_how_its_figures_were_read() -> None:
    # A figure derived rather than printed says so wherever the entry is written.
    pro = lookup("NVIDIA RTX PRO 6000 Blackwell Server Edition")
    assert pro is not None and pro.note
    assert pro.to_dict()["note"] == pro.note
    plain = next(d for d in DATASHEETS if not d.note)
    assert "note" not in plain.to_dict()
