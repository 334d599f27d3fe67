"""What each common data-centre and workstation GPU should reach: its datasheet figures.

One table (:data:`DATASHEETS`), the one home of these numbers: peak *dense* tensor
TFLOP/s per dtype, memory bandwidth, PCIe generation and lanes, board power, NVLink
bandwidth, and the document each comes from. From Ampere on, NVIDIA's datasheets print
tensor figures with 2:4 structured sparsity (marked ``*``), twice the dense ones; some
(L4, H100, H200, Blackwell) print only those. The table holds the dense figure: the
datasheet's own where it prints one, else half the sparse one, as each ``source`` says.
Blackwell's FP4 is left out: the stress test does not measure it.
:func:`lookup` names a GPU's entry from NVML's name; :func:`pcie_gb_per_s` is what a
PCIe link allows in one direction.

Units: TFLOP/s are 10^12 floating-point operations per second (a multiply-add counts
two); bandwidths are GB/s, 10^9 bytes per second; power is watts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

DTYPES: tuple[str, ...] = ("fp8", "bf16", "fp16", "tf32", "fp32")
"""The matmul dtypes measured, in the order they are reported. ``fp32`` is plain FP32 on
the CUDA cores (TF32 off); ``tf32`` is FP32 storage on the tensor cores; ``fp8`` is
E4M3 with an FP32 accumulate."""


@dataclass(frozen=True)
class Datasheet:
    """One GPU model's peak figures.

    Attributes:
        model: the model as NVIDIA names it (``H100 SXM5 80GB``).
        pattern: regular expression over NVML's device name, lower-cased.
        tflops: peak dense TFLOP/s per dtype of :data:`DTYPES`; a dtype left out is not
            supported on the tensor cores (fp8 before Ada/Hopper; bf16/tf32 before Ampere).
        memory_gb_per_s: peak device memory bandwidth, GB/s.
        pcie_gen / pcie_lanes: the host link the board is built for.
        power_w: maximum board power (TDP/TGP), W.
        nvlink_gb_per_s: total NVLink bandwidth of one GPU, both directions, GB/s; ``None``
            for boards without NVLink or with only a bridge between some cards (H100 NVL,
            H200 NVL, PCIe boards; the bridge is in ``note``): there, other pairs of
            GPUs copy over PCIe and must not be judged against NVLink.
        source: the datasheet's name and where it is published.
        note: how a figure was read (accumulate precision, configurable power).
    """

    model: str
    pattern: str
    tflops: Mapping[str, float]
    memory_gb_per_s: float
    pcie_gen: int
    power_w: float
    source: str
    pcie_lanes: int = 16
    nvlink_gb_per_s: float | None = None
    note: str = ""
    _regex: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_regex", re.compile(self.pattern))

    def matches(self, nvml_name: str) -> bool:
        return self._regex.search(nvml_name.lower()) is not None

    def to_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "tflops": dict(self.tflops),
            "memory_gb_per_s": self.memory_gb_per_s,
            "pcie_gen": self.pcie_gen,
            "pcie_lanes": self.pcie_lanes,
            "power_w": self.power_w,
            "nvlink_gb_per_s": self.nvlink_gb_per_s,
            "source": self.source,
            # How a figure was read or derived: a reader judging a figure needs it.
            **({"note": self.note} if self.note else {}),
        }


_V100 = (
    "NVIDIA Tesla V100 GPU Accelerator datasheet (volta-v100-datasheet-update-us-1165301-r5; "
    "columns V100 PCIe, V100 SXM2, V100S PCIe; Volta has no sparsity: its figures are dense), "
    "https://images.nvidia.com/content/technologies/volta/pdf/"
    "volta-v100-datasheet-update-us-1165301-r5.pdf"
)
_A100_40 = (
    "NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-us-nvidia-1758950-r4, the "
    "edition with the 40GB PCIe and 40GB SXM columns; tensor figures here are the ones "
    "without the * of sparsity), https://www.nvidia.com/content/dam/en-zz/Solutions/"
    "Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
)
_A100_80 = (
    "NVIDIA A100 Tensor Core GPU datasheet (nvidia-a100-datasheet-nvidia-us-2188504-web; "
    "columns A100 80GB PCIe and A100 80GB SXM; tensor figures without the * of sparsity), "
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-nvidia-us-2188504-web.pdf"
)
_A10 = (
    "NVIDIA A10 Tensor Core GPU datasheet (tensor figures without the * of sparsity), "
    "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/datasheet-new/"
    "nvidia-a10-datasheet.pdf"
)
_A30 = (
    "NVIDIA A30 Tensor Core GPU datasheet (tensor figures without the * of sparsity), "
    "https://www.nvidia.com/content/dam/en-zz/Solutions/data-center/products/a30-gpu/pdf/"
    "a30-datasheet.pdf"
)
_A40 = (
    "NVIDIA A40 datasheet (tensor figures without the * of sparsity), "
    "https://images.nvidia.com/content/Solutions/data-center/a40/nvidia-a40-datasheet.pdf"
)
_L4 = (
    "NVIDIA L4 Tensor Core GPU datasheet (prints sparse tensor figures only: TF32 120*, "
    "BF16/FP16 242*, FP8 485*; the dense ones here are half), "
    "https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet"
)
_L40 = (
    "NVIDIA L40 GPU datasheet (tensor figures without the * of sparsity), "
    "https://resources.nvidia.com/en-us-l40/l40-datasheet"
)
_L40S = (
    "NVIDIA L40S GPU datasheet (tensor figures without the * of sparsity), "
    "https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413"
)
_H100 = (
    "NVIDIA H100 Tensor Core GPU datasheet (columns H100 SXM and H100 NVL; the earlier edition "
    "has H100 PCIe instead of H100 NVL; it prints sparse tensor figures only, marked *: "
    "SXM TF32 989*, BF16/FP16 1,979*, FP8 3,958*; the dense ones here are half), "
    "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
)
_H200 = (
    "NVIDIA H200 Tensor Core GPU datasheet and product page (columns H200 SXM and H200 NVL; "
    "sparse tensor figures only, marked *: SXM TF32 989*, BF16/FP16 1,979*, FP8 3,958*; "
    "the dense ones here are half), https://www.nvidia.com/en-us/data-center/h200/"
)
_B200 = (
    "NVIDIA HGX B200 specifications (table 'Individual Blackwell GPU Specifications', column "
    "HGX B200; tensor figures with sparsity: FP8 9 PFLOPS, FP16/BF16 4.5 PFLOPS, TF32 2.2 "
    "PFLOPS, whose dense halves are here; TF32 taken as half of BF16, 1.125 PFLOPS, as the "
    "platform total of 18 PFLOPS for 8 GPUs gives, where the per-GPU column rounds to 2.2), "
    "https://www.nvidia.com/en-us/data-center/hgx/"
)
_B100 = (
    "NVIDIA Blackwell Architecture Technical Brief (table 'HGX B100': FP8 56, FP16/BF16 28, "
    "TF32 14 PFLOPS for 8 GPUs, with sparsity; 8 TB/s and 700 W per GPU), "
    "https://resources.nvidia.com/en-us-blackwell-architecture"
)
_GB200 = (
    "NVIDIA GB200 NVL72 specifications (column for one Blackwell GPU of GB200; tensor figures "
    "with sparsity: FP8 10 PFLOPS, FP16/BF16 5 PFLOPS, TF32 2.5 PFLOPS, whose dense halves "
    "are here; 186 GB HBM3e at 8 TB/s; configurable up to 1,200 W), "
    "https://www.nvidia.com/en-us/data-center/gb200-nvl72/"
)
_A6000 = (
    "NVIDIA Ampere GA102 GPU Architecture whitepaper (table: RTX A6000, dense/sparse columns) "
    "and RTX A6000 datasheet (memory, power), https://www.nvidia.com/content/dam/en-zz/"
    "Solutions/design-visualization/quadro-product-literature/"
    "proviz-print-nvidia-rtx-a6000-datasheet-us-nvidia-1454980-r9-web.pdf"
)
_ADA = (
    "NVIDIA Ada Lovelace GPU Architecture whitepaper v2.1 (tables: GeForce RTX 4090, RTX 6000 "
    "Ada; dense/sparse columns), https://images.nvidia.com/aem-dam/Solutions/geforce/ada/"
    "nvidia-ada-gpu-architecture.pdf"
)
_RTX_BLACKWELL = (
    "NVIDIA RTX Blackwell GPU Architecture whitepaper (table: GeForce RTX 5090; dense/sparse "
    "columns), https://images.nvidia.com/aem-dam/Solutions/geforce/blackwell/"
    "nvidia-rtx-blackwell-gpu-architecture.pdf"
)
_RTX_PRO_6000 = (
    "NVIDIA RTX PRO 6000 Blackwell datasheet (Workstation and Server Editions: FP32 125 "
    "TFLOPS, 4,000 AI TOPS, 96 GB GDDR7 at 1,792 GB/s, PCIe Gen5 x16, 600 W), "
    "https://www.nvidia.com/en-us/products/workstations/professional-desktop-gpus/rtx-pro-6000/"
)
_FP32_ACC = "tensor figures with FP32 accumulate (what torch's matmuls use)"

DATASHEETS: tuple[Datasheet, ...] = (
    # Most specific first: the first entry whose pattern matches names the GPU.
    Datasheet(
        "V100 SXM2",
        r"v100[- ]sxm2",
        {"fp16": 125.0, "fp32": 15.7},
        900.0,
        3,
        300.0,
        _V100,
        nvlink_gb_per_s=300.0,
        note="fp16 is the datasheet's 'Tensor Performance' (FP16 with FP32 accumulate)",
    ),
    Datasheet(
        "V100S PCIe",
        r"v100s",
        {"fp16": 130.0, "fp32": 16.4},
        1134.0,
        3,
        250.0,
        _V100,
        note="fp16 is the datasheet's 'Tensor Performance' (FP16 with FP32 accumulate)",
    ),
    Datasheet(
        "V100 PCIe",
        r"v100",
        {"fp16": 112.0, "fp32": 14.0},
        900.0,
        3,
        250.0,
        _V100,
        note="fp16 is the datasheet's 'Tensor Performance' (FP16 with FP32 accumulate)",
    ),
    Datasheet(
        "A100 80GB PCIe",
        r"a100.*80gb.*pcie|a100[- ]pcie[- ]80gb",
        {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
        1935.0,
        4,
        300.0,
        _A100_80,
        note="NVLink bridge for two cards: 600 GB/s",
    ),
    Datasheet(
        "A100 40GB PCIe",
        r"a100.*pcie",
        {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
        1555.0,
        4,
        250.0,
        _A100_40,
        note="NVLink bridge for two cards: 600 GB/s",
    ),
    Datasheet(
        "A100 SXM4 80GB",
        r"a100.*sxm.*80gb",
        {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
        2039.0,
        4,
        400.0,
        _A100_80,
        nvlink_gb_per_s=600.0,
    ),
    Datasheet(
        "A100 SXM4 40GB",
        r"a100",
        {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
        1555.0,
        4,
        400.0,
        _A100_40,
        nvlink_gb_per_s=600.0,
    ),
    Datasheet(
        "A10",
        r"\ba10\b",
        {"bf16": 125.0, "fp16": 125.0, "tf32": 62.5, "fp32": 31.2},
        600.0,
        4,
        150.0,
        _A10,
    ),
    Datasheet(
        "A30",
        r"\ba30\b",
        {"bf16": 165.0, "fp16": 165.0, "tf32": 82.0, "fp32": 10.3},
        933.0,
        4,
        165.0,
        _A30,
        note="NVLink bridge for two cards: 200 GB/s",
    ),
    Datasheet(
        "A40",
        r"\ba40\b",
        {"bf16": 149.7, "fp16": 149.7, "tf32": 74.8, "fp32": 37.4},
        696.0,
        4,
        300.0,
        _A40,
        note="NVLink bridge for two cards: 112.5 GB/s",
    ),
    Datasheet(
        "L4",
        r"\bl4\b",
        {"fp8": 242.5, "bf16": 121.0, "fp16": 121.0, "tf32": 60.0, "fp32": 30.3},
        300.0,
        4,
        72.0,
        _L4,
    ),
    Datasheet(
        "L40S",
        r"\bl40s\b",
        {"fp8": 733.0, "bf16": 362.05, "fp16": 362.05, "tf32": 183.0, "fp32": 91.6},
        864.0,
        4,
        350.0,
        _L40S,
        note="the datasheet's dense FP8 (733) is not quite twice its dense BF16 (362.05): "
        "both are kept as printed",
    ),
    Datasheet(
        "L40",
        r"\bl40\b",
        {"fp8": 362.0, "bf16": 181.05, "fp16": 181.05, "tf32": 90.5, "fp32": 90.5},
        864.0,
        4,
        300.0,
        _L40,
        note="the datasheet's tensor figures are half the L40S's on the same AD102",
    ),
    Datasheet(
        "H100 NVL",
        r"h100.*nvl",
        {"fp8": 1670.5, "bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
        3900.0,
        5,
        400.0,
        _H100,
        note="power configurable 350-400 W; NVLink bridge between pairs of cards: 600 GB/s",
    ),
    Datasheet(
        "H100 PCIe",
        r"h100.*pcie",
        {"fp8": 1513.0, "bf16": 756.5, "fp16": 756.5, "tf32": 378.0, "fp32": 51.0},
        2000.0,
        5,
        350.0,
        _H100,
        note="power configurable 300-350 W; NVLink bridge for two cards: 600 GB/s",
    ),
    Datasheet(
        "H100 SXM5",
        r"h100",
        {"fp8": 1979.0, "bf16": 989.5, "fp16": 989.5, "tf32": 494.5, "fp32": 67.0},
        3350.0,
        5,
        700.0,
        _H100,
        nvlink_gb_per_s=900.0,
        note="power configurable up to 700 W",
    ),
    Datasheet(
        "H200 NVL",
        r"\bh200\b.*nvl",
        {"fp8": 1670.5, "bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60.0},
        4800.0,
        5,
        600.0,
        _H200,
        note="power configurable up to 600 W; 2- or 4-way NVLink bridge: 900 GB/s per GPU",
    ),
    Datasheet(
        "H200 SXM",
        r"\bh200\b",
        {"fp8": 1979.0, "bf16": 989.5, "fp16": 989.5, "tf32": 494.5, "fp32": 67.0},
        4800.0,
        5,
        700.0,
        _H200,
        nvlink_gb_per_s=900.0,
        note="power configurable up to 700 W",
    ),
    Datasheet(
        "GB200",
        r"\bgb200\b",
        {"fp8": 5000.0, "bf16": 2500.0, "fp16": 2500.0, "tf32": 1250.0, "fp32": 80.0},
        8000.0,
        5,
        1200.0,
        _GB200,
        nvlink_gb_per_s=1800.0,
        note="its host link is NVLink-C2C to the Grace CPU (900 GB/s), not PCIe; power "
        "configurable up to 1,200 W; FP4 (not measured) left out",
    ),
    Datasheet(
        "B200",
        r"\bb200\b",
        {"fp8": 4500.0, "bf16": 2250.0, "fp16": 2250.0, "tf32": 1125.0, "fp32": 75.0},
        7700.0,
        5,
        1000.0,
        _B200,
        nvlink_gb_per_s=1800.0,
        note="power configurable up to 1,000 W; 180 GB HBM3e at 7.7 TB/s (the first "
        "datasheets said 192 GB at 8 TB/s); FP4 (not measured) left out",
    ),
    Datasheet(
        "B100",
        r"\bb100\b",
        {"fp8": 3500.0, "bf16": 1750.0, "fp16": 1750.0, "tf32": 875.0, "fp32": 60.0},
        8000.0,
        5,
        700.0,
        _B100,
        nvlink_gb_per_s=1800.0,
        note="fp32 is not in the brief: 60 is twice its FP64 of 30 TFLOPS, the FP32:FP64 "
        "ratio of the B200 (75:37); FP4 (not measured) left out",
    ),
    Datasheet(
        "RTX A6000",
        r"rtx a6000",
        {"bf16": 154.8, "fp16": 154.8, "tf32": 77.4, "fp32": 38.7},
        768.0,
        4,
        300.0,
        _A6000,
        note=_FP32_ACC + "; NVLink bridge for two cards: 112.5 GB/s",
    ),
    Datasheet(
        "RTX 6000 Ada",
        r"rtx 6000 ada",
        {"fp8": 728.5, "bf16": 364.2, "fp16": 364.2, "tf32": 182.1, "fp32": 91.1},
        960.0,
        4,
        300.0,
        _ADA,
        note=_FP32_ACC,
    ),
    Datasheet(
        "RTX PRO 6000 Blackwell",
        # The Max-Q Workstation Edition (300 W) runs lower clocks than these figures.
        r"rtx pro 6000 blackwell(?!.*max-q)",
        {"fp8": 1000.0, "bf16": 500.0, "fp16": 500.0, "tf32": 250.0, "fp32": 125.0},
        1792.0,
        5,
        600.0,
        _RTX_PRO_6000,
        note="tensor figures not in the datasheet: derived from its 4,000 AI TOPS (FP4 with "
        "sparsity) as FP4 = 2 x FP8 = 4 x FP16 = 8 x TF32, halved for dense, at full rate "
        "with FP32 accumulate as on the RTX 6000 Ada; Server Edition power configurable "
        "400-600 W",
    ),
    Datasheet(
        "GeForce RTX 4090",
        r"rtx 4090",
        {"fp8": 330.3, "bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6},
        1008.0,
        4,
        450.0,
        _ADA,
        note=_FP32_ACC + " (GeForce halves them against FP16 accumulate)",
    ),
    Datasheet(
        "GeForce RTX 5090",
        r"rtx 5090",
        {"fp8": 419.0, "bf16": 209.5, "fp16": 209.5, "tf32": 104.8, "fp32": 104.8},
        1792.0,
        5,
        575.0,
        _RTX_BLACKWELL,
        note=_FP32_ACC + " (GeForce halves them against FP16 accumulate); FP4 (not "
        "measured) left out",
    ),
)


def lookup(nvml_name: str) -> Datasheet | None:
    """The datasheet of the GPU NVML names ``nvml_name``, or ``None`` for a model not in
    the table (it is then judged against the machine's other GPUs only)."""
    return next((d for d in DATASHEETS if d.matches(nvml_name)), None)


PCIE_LANE_GB_PER_S: Mapping[int, float] = {
    1: 0.25,  # 2.5 GT/s, 8b/10b
    2: 0.5,  # 5 GT/s, 8b/10b
    3: 0.985,  # 8 GT/s, 128b/130b
    4: 1.969,  # 16 GT/s, 128b/130b
    5: 3.938,  # 32 GT/s, 128b/130b
    6: 7.563,  # 64 GT/s, PAM4 with FLIT encoding (242/256)
}
"""Usable bandwidth of one PCIe lane in one direction, GB/s, after line encoding and
before packet overhead (PCI Express Base Specifications 1.0-6.0, PCI-SIG). Transfers
reach about 80-90 % of it: the rest is transaction-layer headers and flow control."""


def pcie_gb_per_s(gen: int | None, lanes: int | None) -> float | None:
    """What a PCIe link of ``gen`` and ``lanes`` allows in one direction, GB/s; ``None``
    when either is unknown."""
    if gen is None or lanes is None or gen not in PCIE_LANE_GB_PER_S or lanes <= 0:
        return None
    return round(PCIE_LANE_GB_PER_S[gen] * lanes, 3)
