"""What GPU faults mean: the one home of the Xid catalogue, clock-event reasons and OOM patterns.

doctor (``doctor/checks``), the run diagnosis (``diagnose/hardware.py``,
``diagnose/thermal.py``) and the failure classifier (``resilience/classify.py``)
all judge from these tables, so they agree on every Xid code, every clock
reason and every out-of-memory message.

* **Xids** are classified by the immediate action of NVIDIA's Xid catalogue
  (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, Ampere and
  newer; the edition in :data:`XID_CATALOGUE_VERSION`): restart the
  application, reset the GPU, drain the node (reboot it or have it serviced),
  or ignore. Xid 154 carries the driver's own recovery action in its message,
  which decides. :func:`parse_xid_line` reads kernel log lines, MIG ones
  (``Xid (PCI:0000:01:00 GPU-I:05): 94, ...``) included.
* **Clock event reasons** (NVML's bitmask): which bits slow a GPU that works,
  under which thresholds, and the fix for each (:func:`active_reasons`).
* **Out-of-memory messages** of CUDA and torch (:func:`parse_cuda_oom`).
* **Fabric Manager down**: CUDA error 802 (``cudaErrorSystemNotReady``,
  "system not yet initialized"), what CUDA says on an NVSwitch machine whose
  Fabric Manager is not running (:func:`is_fabric_manager_down`).

Levels are finding severities as plain strings (``"error"``, ``"warning"``,
``"info"``): this layer sits below the finding model.

Why one module of this length: it is the one home of these facts (docs/architecture.md,
"One home for each fact"); most of its lines are the tables themselves.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from trainmedic.gpu.types import ClockEventReason, GpuSample, normalize_pci_bus_id

# ------------------------------------------------------------------------------- Xids


class XidAction(str, Enum):
    """What NVIDIA's catalogue says to do right away (its "immediate action")."""

    IGNORE = "ignore"
    RESTART_APP = "restart_app"
    RESET_GPU = "reset_gpu"
    DRAIN_NODE = "drain_node"
    UNKNOWN = "unknown"  # a code the catalogue does not list

    def __str__(self) -> str:
        return self.value


XID_CATALOGUE_VERSION = (
    "NVIDIA Xid Catalog (docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html and "
    "Xid-Catalog.xlsx), the edition listing codes 1-172, its newest rows for CUDA 12.9 / "
    "driver R575"
)
"""The edition of the catalogue the table follows (the page carries no date or
version of its own: its last code and newest driver name it)."""
XID_CATALOGUE_LAST = 172
"""The highest code the catalogue lists; higher codes are :attr:`XidAction.UNKNOWN`."""

#: The catalogue's "Resolution Bucket (Immediate Action)" column, code by code.
#: Codes up to 161 not listed here are CONTACT_SUPPORT (unused codes and 142);
#: 154 takes the action named in its message.
_BUCKET_CODES = {
    "RESTART_APP": "8,11,13,25,31,32,39-41,60,68-72,75-77,80,82-86,88,89,94,96-105,126-135,139",
    "IGNORE": "14,37,38,43,44,63,66,67,92,93,106-108,121,137,141,152,153,157,160,161",
    "RESET_GPU": "46,62,64,95,109,110,119,120,136,140,143,155,156,158",
    "WORKFLOW_XID_45": "45",
    "WORKFLOW_XID_48": "48",
    "WORKFLOW_NVLINK_ERR": "74",
    "WORKFLOW_NVLINK5_ERR": "144-150",
    "RESTART_BM": "79",
    "RESTART_VM": "151",
    "CHECK_MECHANICALS": "54",
    "UPDATE_SWFW": "78",
    "CHECK_UVM": "159",
    "XID_154": "154",
}
#: Codes 162-172 have an empty immediate-action column in this edition. Four of
#: them reach H100/H200 and end jobs (issue 21, defect 4), so they are judged
#: by the catalogue's own description of them: like the listed code it names
#: (171, 172) or describes alike (167, 169). The table test checks that only
#: codes with an empty column are judged this way.
INFERRED_BUCKET = {
    167: "RESET_GPU",  # PCIE_FATAL_TIMEOUT: a fatal timeout, as 158 (GPU_FATAL_TIMEOUT)
    169: "RESET_GPU",  # SEC2_HALT_ERROR, "internal micro-controller halt", as 62 (PMU halt)
    171: "WORKFLOW_XID_48",  # UNCORRECTABLE_DRAM_ERROR: "additional to Xid 48"
    172: "WORKFLOW_XID_48",  # UNCORRECTABLE_SRAM_ERROR: "additional to Xid 48"
}
NO_ACTION_LISTED = "NO_ACTION_LISTED"
"""The bucket of the other codes listed without an action: power-smoothing
events (162-165), confidential-computing-only codes (166, 170) and 168 (errors
in the write-protected region, with ECC off). They are known, but the catalogue
says nothing to do, so their action is :attr:`XidAction.UNKNOWN`."""

#: Bucket -> action. The workflows of Xid 45 (cleanup after another error) and
#: CHECK_UVM end in restarting the application; those of Xid 48 and NVLink
#: errors in a GPU reset; bare-metal or VM restarts, support cases, mechanical
#: checks and firmware updates all take the node out of service. A code listed
#: without an action is known but not judged.
BUCKET_ACTION = {
    "IGNORE": XidAction.IGNORE,
    "RESTART_APP": XidAction.RESTART_APP,
    "WORKFLOW_XID_45": XidAction.RESTART_APP,
    "CHECK_UVM": XidAction.RESTART_APP,
    "RESET_GPU": XidAction.RESET_GPU,
    "WORKFLOW_XID_48": XidAction.RESET_GPU,
    "WORKFLOW_NVLINK_ERR": XidAction.RESET_GPU,
    "WORKFLOW_NVLINK5_ERR": XidAction.RESET_GPU,
    "RESTART_BM": XidAction.DRAIN_NODE,
    "RESTART_VM": XidAction.DRAIN_NODE,
    "CONTACT_SUPPORT": XidAction.DRAIN_NODE,
    "CHECK_MECHANICALS": XidAction.DRAIN_NODE,
    "UPDATE_SWFW": XidAction.DRAIN_NODE,
    NO_ACTION_LISTED: XidAction.UNKNOWN,
}

#: What the common codes mean (the catalogue's descriptions, shortened).
_MEANINGS = {
    8: "GPU stopped processing (channel idle timeout)",
    11: "invalid or corrupted push buffer stream",
    13: "graphics engine exception (often an out-of-range access in a kernel)",
    31: "GPU memory page fault (a kernel accessed an invalid address)",
    32: "invalid or corrupted push buffer stream (PBDMA)",
    43: "GPU stopped processing (the application's channel was reset)",
    45: "preemptive cleanup after another error or a killed process",
    46: "GPU stopped processing (timeout)",
    48: "double-bit ECC error",
    54: "auxiliary power is not connected or the GPU draws too much power",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapping failure",
    69: "graphics engine class error",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    93: "inforom erase limit exceeded",
    94: "contained ECC error (only the application that touched it was stopped)",
    95: "uncontained ECC error",
    108: "NVLink remote translation error",
    109: "context switch timeout",
    110: "security fault",
    119: "GSP RPC timeout",
    120: "GSP error",
    121: "C2C link error (corrected)",
    136: "link training failure",
    140: "unrecovered ECC error",
    143: "GPU initialisation failure",
    151: "key rotation error (confidential computing)",
    154: "GPU recovery action changed",
    155: "NVLink software-defined error",
    156: "resource retirement event",
    157: "resource retirement failure",
    158: "GPU fatal timeout",
    159: "CHI non-data error",
    160: "channel retirement event",
    161: "channel retirement failure",
    162: "power smoothing circuitry re-engaged",
    163: "power smoothing circuitry disengaged",
    164: "power smoothing circuitry near the end of its lifetime",
    165: "power smoothing circuitry lifetime exhausted",
    166: "confidential-computing traffic before the NVLink was set up for encryption",
    167: "PCIe fatal timeout",
    168: "reduced GPU memory capacity (errors in the write-protected region)",
    169: "internal micro-controller halt (SEC2)",
    170: "NVLink interrupt in confidential-computing mode",
    171: "uncorrectable DRAM error (detail of an Xid 48)",
    172: "uncorrectable SRAM error (detail of an Xid 48)",
}
for _code in range(144, 151):
    _MEANINGS[_code] = "NVLink error"

LOST_GPU_XIDS: tuple[tuple[int, ...], ...] = ((79,), (48, 64, 95), (119, 120))
"""Xids that explain a GPU that stopped answering: off the bus, memory errors, GSP."""


def xid_meaning(code: int) -> str:
    """What Xid ``code`` means, shortened from NVIDIA's catalogue."""
    return _MEANINGS.get(code, "see NVIDIA's Xid catalogue")


def lost_gpu_xid_hint() -> str:
    """The Xids to look for when a GPU stopped answering, for a fix's text:
    ``79 (GPU has fallen off the bus); 48/64/95 (double-bit ECC error, ...)``."""
    return "; ".join(
        "/".join(map(str, codes)) + " (" + ", ".join(xid_meaning(c) for c in codes) + ")"
        for codes in LOST_GPU_XIDS
    )


HARDWARE_RESTART_CODES = frozenset({94})
"""RESTART_APP codes that point at the GPU's memory rather than the program: the
job failed because of the hardware, yet the GPU stays usable."""

#: Xid 154's "recovery action changed ... to 0xN (...)" values: NVML's
#: nvmlDeviceGpuRecoveryAction_t (nvidia-ml-py 13.615: 5 came with NVML 595,
#: 6 and 7 with NVML 615). A value not listed here is read as a GPU reset.
_RECOVERY_ACTION = {
    0: XidAction.IGNORE,  # NONE: no action needed
    1: XidAction.RESET_GPU,  # GPU_RESET
    2: XidAction.DRAIN_NODE,  # NODE_REBOOT
    3: XidAction.RESET_GPU,  # DRAIN_P2P: drain peer-to-peer traffic, then reset
    4: XidAction.RESET_GPU,  # DRAIN_AND_RESET
    # RECOVER_IMEX_DOMAIN: the multi-node NVLink (IMEX) domain must be recovered, which
    # no reset of this one GPU does: the job must leave the node until it is.
    5: XidAction.DRAIN_NODE,
    6: XidAction.RESET_GPU,  # BUS_RESET: reset the GPU's PCIe bus
    7: XidAction.DRAIN_NODE,  # SYSTEM_REBOOT: reboot the system
}
_RECOVERY_RE = re.compile(r"recovery action changed from 0x[0-9a-f]+.*? to 0x([0-9a-f]+)", re.I)


def _expand(ranges: str) -> list[int]:
    out: list[int] = []
    for part in ranges.split(","):
        first, _, last = part.partition("-")
        out += range(int(first), int(last or first) + 1)
    return out


XID_BUCKET: dict[int, str] = {
    code: bucket for bucket, ranges in _BUCKET_CODES.items() for code in _expand(ranges)
}
XID_BUCKET.update(INFERRED_BUCKET)
for _code in range(1, XID_CATALOGUE_LAST + 1):
    XID_BUCKET.setdefault(_code, "CONTACT_SUPPORT" if _code < 162 else NO_ACTION_LISTED)


@dataclass(frozen=True)
class XidVerdict:
    """What one Xid means and what to do about it.

    Attributes:
        action: the catalogue's immediate action (Xid 154: the driver's).
        hardware: the GPU itself needs attention: leave it out of the next
            attempt and reset or drain it (RESET_GPU and DRAIN_NODE codes).
        level: ``"error"``, ``"warning"`` or ``"info"``: the finding's severity.
        meaning / fix: for the finding's title and fix.
    """

    code: int
    action: XidAction
    hardware: bool
    level: str
    meaning: str
    fix: str


_FIX = {
    XidAction.IGNORE: "Nothing to do now: NVIDIA's catalogue lists this Xid as informational. "
    "Reset the GPU at the next maintenance window if it asks for one (nvidia-smi -q -d "
    "ROW_REMAPPER shows pending remaps); drain it if the count keeps growing.",
    XidAction.RESTART_APP: "Restart the job; the GPU can stay in use. If it repeats with the "
    "same code, run once with CUDA_LAUNCH_BLOCKING=1 and compute-sanitizer to find the "
    "faulting kernel, and drain the GPU if it repeats with code known to be good.",
    XidAction.RESET_GPU: "Stop the jobs on this GPU and reset it (sudo nvidia-smi -r -i <index>) "
    "or reboot; until then keep work off it (CUDA_VISIBLE_DEVICES without it, or the "
    "scheduler's exclude list). Report it to the provider if it repeats.",
    XidAction.DRAIN_NODE: "Drain the node: move the job to another machine, then reboot it and "
    "have the GPU checked (nvidia-bug-report.sh for NVIDIA support, or the provider).",
    XidAction.UNKNOWN: "Look the code up in NVIDIA's Xid catalogue; drain the GPU if it repeats.",
}
_FIX_HARDWARE_RESTART = (
    "Restart the job: the driver contained the memory error and retired the page, so the GPU "
    "stays usable. Reset it at the next maintenance window so the row remap takes effect "
    "(nvidia-smi -q -d ROW_REMAPPER); drain it if contained errors repeat."
)
_LEVEL = {
    XidAction.IGNORE: "info",
    XidAction.RESTART_APP: "warning",
    XidAction.RESET_GPU: "error",
    XidAction.DRAIN_NODE: "error",
    XidAction.UNKNOWN: "warning",
}


def xid_verdict(code: int, detail: str = "") -> XidVerdict:
    """Classify Xid ``code``; ``detail`` is the text after the code (Xid 154's action)."""
    bucket = XID_BUCKET.get(code)
    if bucket is None:
        action = XidAction.UNKNOWN
    elif bucket == "XID_154":
        m = _RECOVERY_RE.search(detail)
        # Without a readable action, a reset is what the driver asks for most often.
        stated = _RECOVERY_ACTION.get(int(m[1], 16)) if m else None
        action = stated or XidAction.RESET_GPU
    else:
        action = BUCKET_ACTION[bucket]
    hardware = action in (XidAction.RESET_GPU, XidAction.DRAIN_NODE)
    meaning = xid_meaning(code)
    fix = _FIX_HARDWARE_RESTART if code in HARDWARE_RESTART_CODES else _FIX[action]
    return XidVerdict(code, action, hardware, _LEVEL[action], meaning, fix)


@dataclass(frozen=True)
class XidEvent:
    """One ``NVRM: Xid`` kernel log line, parsed.

    Attributes:
        pci_bus_id: the GPU's PCI address, normalised (``0000:3b:00.0``).
        gpu_instance: the MIG GPU instance (``GPU-I:05`` -> 5), when given.
        pid / process: the process the driver names, when it names one.
        detail: the text after the code.
        line: the message as logged (kernel timestamp prefix removed).
    """

    code: int
    pci_bus_id: str | None
    gpu_instance: int | None
    pid: int | None
    process: str | None
    detail: str
    line: str

    @property
    def verdict(self) -> XidVerdict:
        return xid_verdict(self.code, self.detail)


# "NVRM: Xid (PCI:0000:3b:00): 79, pid=..." ; "NVRM: Xid (0000:03:00): 14, Channel ..." ;
# "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 94, pid=..., Contained: ..." (MIG).
_XID_LINE_RE = re.compile(r"NVRM: Xid \(([^)]*)\):?\s*(\d+)\s*(?:,\s*(.*))?$")
_BUS_RE = re.compile(r"(?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)")
_INSTANCE_RE = re.compile(r"GPU-I:\s*(\d+)")
_PID_RE = re.compile(r"\bpid=(\d+)")
_NAME_RE = re.compile(r"\bname=([^,\s]+)")
#: the line the driver logs before a GPU's first Xid: "NVRM: GPU at PCI:0000:3b:00: GPU-<uuid>"
GPU_AT_RE = re.compile(r"NVRM: GPU at (?:PCI:)?([0-9a-fA-F:.]+): (GPU-[0-9a-fA-F-]+)")


_XID_IN_TEXT_RE = re.compile(r"\bxid\b(?:\s*\([^)]*\))?\s*:?\s*(\d+)", re.IGNORECASE)
"""An Xid named in text that is not a kernel line: ``Xid 79``, ``xid: 79``."""


def xid_in_text(text: str) -> int | None:
    """The Xid code named in ``text`` (a kernel line or free text), or ``None``."""
    m = _XID_IN_TEXT_RE.search(text)
    return int(m[1]) if m else None


def xid_from_report(message: str, data: Mapping[str, Any]) -> XidEvent | None:
    """An Xid reported as data (an ``xid`` run event: the Xid watch's, from NVML or the
    kernel log): its kernel line when ``message`` is one, else the code and the GPU in
    ``data`` (``xid``, ``pci_bus_id``, ``gpu_instance``, ``pid``, ``detail``), else an
    Xid named in ``message`` (``Xid 79``). ``None`` when it names none."""
    parsed = parse_xid_line(message)
    code = _data_int(data, "xid", "code")
    if parsed is not None and (code is None or code == parsed.code):
        return parsed
    if code is None:
        code = xid_in_text(message)
        if code is None:
            return None
    bus = data.get("pci_bus_id")
    return XidEvent(
        code=code,
        pci_bus_id=normalize_pci_bus_id(bus) if isinstance(bus, str) and bus else None,
        gpu_instance=_data_int(data, "gpu_instance"),
        pid=_data_int(data, "pid"),
        process=None,
        detail=str(data.get("detail") or ""),
        line=message,
    )


def xid_report_gpu(data: Mapping[str, Any]) -> int | None:
    """The GPU index of an Xid reported as data (``gpu``), when it names one."""
    return _data_int(data, "gpu", "index")


def _data_int(data: Mapping[str, Any], *keys: str) -> int | None:
    for k in keys:
        v = data.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
        if isinstance(v, str) and v.isdigit():
            return int(v)
    return None


def parse_xid_line(line: str) -> XidEvent | None:
    """The Xid in a kernel log line (``dmesg`` or ``/dev/kmsg`` message), or ``None``."""
    m = _XID_LINE_RE.search(line.rstrip())
    if m is None:
        return None
    where, code, detail = m[1], int(m[2]), (m[3] or "").strip()
    bus = _BUS_RE.search(where)
    instance = _INSTANCE_RE.search(where)
    pid = _PID_RE.search(detail)
    name = _NAME_RE.search(detail)
    process = name[1].strip("'\"") if name else None
    return XidEvent(
        code=code,
        pci_bus_id=normalize_pci_bus_id(bus[1]) if bus else None,
        gpu_instance=int(instance[1]) if instance else None,
        pid=int(pid[1]) if pid else None,
        process=None if process in (None, "<unknown>") else process,
        detail=detail,
        line=line[line.find("NVRM: Xid") :].strip(),
    )


# ------------------------------------------------------------------ clock event reasons

LOADED_UTILIZATION_PCT = 50.0
"""A kernel ran at least this share of the time: a lower clock costs throughput;
below it, the driver lowering clocks is power management."""
LIMIT_CLOCK_RATIO = 0.85
"""Boost clocks under full load sit a little under the maximum on healthy GPUs;
a limit (power cap, board, reliability) counts when it holds the SM clock under
this share of its maximum."""
NEAR_SLOWDOWN_MARGIN_C = 5.0
"""Within this many degrees of the slowdown temperature a loaded GPU's normal
swings (workload phases, fan lag, inlet drift) carry it into slowdown."""

R = ClockEventReason

_COOLING = (
    "Improve cooling: check the fans (nvidia-smi -q -d TEMPERATURE,PERFORMANCE), airflow "
    "through the chassis (blanking panels, nothing blocking intake), dust on heatsinks and "
    "filters and the room's inlet temperature, or lower the power limit (nvidia-smi -pl) for "
    "steady clocks; on a rented machine, report the node to the provider."
)


@dataclass(frozen=True)
class ClockReasonRule:
    """When one clock event reason counts, and what it means.

    Attributes:
        key: stable suffix of finding ids (``thermal.clock_event.<key>``).
        hard: counts whenever the GPU is not idle; otherwise a limit that counts
            only on a loaded GPU clocked under :data:`LIMIT_CLOCK_RATIO`.
        level: severity when it holds (the run lowers brief hard slowdowns).
    """

    flag: ClockEventReason
    key: str
    name: str
    hard: bool
    level: str
    meaning: str
    fix: str


#: Most specific first: NVML sets HW_SLOWDOWN together with the thermal and
#: power-brake bits, and the first rule present names the finding.
CLOCK_RULES: tuple[ClockReasonRule, ...] = (
    ClockReasonRule(
        R.HW_THERMAL_SLOWDOWN, "hw_thermal", "hardware thermal slowdown", True, "error",
        "the GPU is too hot and hardware cut its clocks", _COOLING,
    ),
    ClockReasonRule(
        R.HW_POWER_BRAKE_SLOWDOWN, "hw_power_brake", "power brake", True, "error",
        "the server asserted the external power brake and the GPU cut its clocks",
        "The power brake comes from the server, not the GPU: check the power supplies (a "
        "failed or missing redundant PSU), the BMC/IPMI event log (ipmitool sel list) and the "
        "rack's power budget; on a rented machine, report the node to the provider.",
    ),
    ClockReasonRule(
        R.HW_SLOWDOWN, "hw_slowdown", "hardware slowdown", True, "error",
        "clocks cut by half or more (temperature, a power draw spike or a power supply fault)",
        "Check temperature and power (nvidia-smi -q -d TEMPERATURE,POWER,PERFORMANCE) and the "
        "kernel log for Xid errors; if the GPU is cool and within its power limit, the power "
        "delivery is suspect: drain the node and have the hardware checked.",
    ),
    ClockReasonRule(
        R.SW_THERMAL_SLOWDOWN, "sw_thermal", "thermal slowdown", True, "warning",
        "the driver lowers clocks to keep the GPU under its maximum operating temperature",
        _COOLING,
    ),
    ClockReasonRule(
        R.RELIABILITY, "reliability", "reliability limit", False, "warning",
        "the GPU holds clocks down to stay within its reliability (voltage) limits",
        "Usually heat: improve cooling so the GPU runs cooler at the same clocks; if it "
        "persists at normal temperature, report the GPU to the provider or NVIDIA support.",
    ),
    ClockReasonRule(
        R.BOARD_LIMIT, "board_limit", "board limit", False, "warning",
        "a limit of the board itself (not the settable power limit) holds clocks down",
        "Nothing to set: the board's own limit applies. Compare with other GPUs of the same "
        "model (nvidia-smi -q -d PERFORMANCE); if only this one shows it, report it.",
    ),
    ClockReasonRule(
        R.SW_POWER_CAP, "sw_power_cap", "power cap", False, "warning",
        "the power limit holds the SM clock well below its maximum",
        "Compare the enforced power limit with the default and maximum (nvidia-smi -q -d "
        "POWER); if someone lowered it, restore it (sudo nvidia-smi -i <index> -pl <default "
        "watts>). At the default, the card runs at its design power and only a GPU with a "
        "higher power budget is faster.",
    ),
)
CLOCK_RULE_BY_KEY = {rule.key: rule for rule in CLOCK_RULES}
HARD_MASK = R.NONE
LIMIT_MASK = R.NONE
for _rule in CLOCK_RULES:
    if _rule.hard:
        HARD_MASK |= _rule.flag
    else:
        LIMIT_MASK |= _rule.flag


def is_loaded(s: GpuSample, loaded_util_pct: float = LOADED_UTILIZATION_PCT) -> bool:
    """A kernel ran at least ``loaded_util_pct`` of the time and the GPU is not idle."""
    if R.GPU_IDLE in s.reasons:
        return False
    return s.utilization_gpu_pct is not None and s.utilization_gpu_pct >= loaded_util_pct


def clock_ratio(s: GpuSample) -> float | None:
    """SM clock over its maximum, ``None`` when either is unknown."""
    if s.sm_clock_mhz is None or not s.sm_clock_max_mhz:
        return None
    return s.sm_clock_mhz / s.sm_clock_max_mhz


def active_reasons(
    s: GpuSample,
    loaded_util_pct: float = LOADED_UTILIZATION_PCT,
    limit_clock_ratio: float = LIMIT_CLOCK_RATIO,
) -> ClockEventReason:
    """The reasons that slow this GPU now.

    Hard reasons count at once; limits (power cap, board, reliability) only on
    a loaded GPU clocked under ``limit_clock_ratio`` of its maximum (a busy GPU
    often touches its cap near full clock); a reading with GPU_IDLE never counts.
    """
    if s.clock_event_reasons is None or R.GPU_IDLE in s.reasons:
        return R.NONE
    active = s.reasons & HARD_MASK
    limits = s.reasons & LIMIT_MASK
    ratio = clock_ratio(s)
    if limits and is_loaded(s, loaded_util_pct) and ratio is not None and ratio < limit_clock_ratio:
        active |= limits
    return active


def leading_rule(active: ClockEventReason) -> ClockReasonRule | None:
    """The most specific rule among ``active`` reasons (it names the finding)."""
    return next((rule for rule in CLOCK_RULES if rule.flag in active), None)


def reason_names(reasons: ClockEventReason) -> list[str]:
    """Reasons as snake-case names (``hw_slowdown``), in NVML bit order."""
    return [
        flag.name.lower()
        for flag in ClockEventReason
        if flag.name is not None and flag is not R.NONE and flag in reasons
    ]


def rule_keys(reasons: ClockEventReason) -> list[str]:
    """Rule keys of ``reasons``, most specific first."""
    return [rule.key for rule in CLOCK_RULES if rule.flag in reasons]


# ------------------------------------------------------------------------- out of memory

_SIZE = r"(\d+(?:\.\d+)?) ?(bytes|[KMGTP]i?B)"
_UNITS = {"bytes": 1, "B": 1}
for _i, _p in enumerate("KMGTP", start=1):
    _UNITS[f"{_p}iB"] = 1024**_i
    _UNITS[f"{_p}B"] = 1024**_i  # torch < 2.1 printed "GB" for GiB values

CUDA_OOM_RE = re.compile(
    r"(?:torch\.(?:cuda\.)?)?OutOfMemoryError|CUDA out of memory|CUDA error: out of memory"
    r"|CUBLAS_STATUS_ALLOC_FAILED|Cuda failure 'out of memory'|HIP out of memory"
    r"|CUDNN_STATUS_(?:ALLOC_FAILED|NOT_ENOUGH_WORKSPACE)|MPS backend out of memory"
)
"""A line that says a GPU ran out of memory (torch's error, CUDA's, cuBLAS's, cuDNN's,
NCCL's): the failure classifier's and the in-job remedies' one test."""
_OOM_NEW_RE = re.compile(
    rf"Tried to allocate {_SIZE}\. GPU (\d+) has a total capacity of {_SIZE} "
    rf"of which {_SIZE} is free"
)
_OOM_OLD_RE = re.compile(
    rf"Tried to allocate {_SIZE} \(GPU (\d+); {_SIZE} total capacity; {_SIZE} already allocated; "
    rf"{_SIZE} free; {_SIZE} reserved in total by PyTorch"
)
_OOM_UNALLOCATED_RE = re.compile(rf"{_SIZE} is reserved by PyTorch but unallocated")
_OOM_ALLOCATED_RE = re.compile(rf"Of the allocated memory {_SIZE} is allocated by PyTorch")


TF_OOM_RE = re.compile(
    r"OOM when allocating tensor with shape ?\[([\d, ]*)\] and type (\w+)"
    r"(?: on (?:\S*device:)?(GPU|CPU):(\d+))?"
)
"""TensorFlow's out-of-memory error (``ResourceExhaustedError``): the tensor it could not
allocate, and on which device (absent in some versions' texts)."""
XLA_OOM_RE = re.compile(r"RESOURCE_EXHAUSTED: Out of memory while trying to allocate (\d+) bytes")
"""XLA's (TensorFlow with ``jit_compile``, JAX): the device is a GPU where this tool runs."""
_TF_DTYPE_BYTES = {
    "bool": 1, "int8": 1, "uint8": 1, "qint8": 1, "quint8": 1,
    "half": 2, "bfloat16": 2, "int16": 2, "uint16": 2,
    "float": 4, "int32": 4, "uint32": 4, "qint32": 4,
    "double": 8, "int64": 8, "uint64": 8, "complex64": 8, "complex128": 16,
}  # fmt: skip
_BFC_RE = re.compile(rf"Allocator \((GPU_(\d+)_bfc)\) ran out of memory trying to allocate {_SIZE}")


def parse_tf_oom(text: str) -> dict[str, Any] | None:
    """TensorFlow's (or XLA's) out-of-memory error in ``text``: ``framework``, ``device``
    (``GPU``/``CPU``, ``None`` unsaid), ``cuda_device``, ``tensor_shape``, ``dtype`` and
    ``requested_bytes`` where the text gives them; ``None`` when it reports none.

    TensorFlow's allocator warns "ran out of memory ... this is not a failure" while it
    still has ways to go on: only the error itself counts, and the allocator's line
    before it only adds the size (its device numbering is the process's, like torch's)."""
    if m := TF_OOM_RE.search(text):
        dims = [int(d) for d in m[1].replace(" ", "").split(",") if d]
        out: dict[str, Any] = {
            "framework": "tensorflow",
            "tensor_shape": dims,
            "dtype": m[2],
            "device": m[3],
        }
        if m[3] is not None:
            out["cuda_device" if m[3] == "GPU" else "cpu_device"] = int(m[4])
        width = _TF_DTYPE_BYTES.get(m[2])
        if width is not None:
            n = 1
            for d in dims:
                n *= d
            out["requested_bytes"] = n * width
        if out["device"] is None and "GPU_" in text and "_bfc" in text:
            out["device"] = "GPU"  # "by allocator GPU_0_bfc" said it after all
        return out
    if m := XLA_OOM_RE.search(text):
        return {"framework": "xla", "device": "GPU", "requested_bytes": int(m[1])}
    return None


def parse_bfc_oom(text: str) -> dict[str, Any]:
    """The size in TensorFlow's allocator line (``Allocator (GPU_0_bfc) ran out of memory
    trying to allocate 4.00GiB``), bytes, and its process-local GPU."""
    m = _BFC_RE.search(text)
    if m is None:
        return {}
    return {"requested_bytes": _bytes(m[3], m[4]), "cuda_device": int(m[2])}


def is_cuda_oom(text: str) -> bool:
    """Whether ``text`` reports a GPU out-of-memory error."""
    return CUDA_OOM_RE.search(text) is not None


def _bytes(number: str, unit: str) -> int:
    return int(float(number) * _UNITS[unit])


def parse_cuda_oom(text: str) -> dict[str, Any]:
    """Sizes in torch's OOM message (torch >= 2.1 and older formats), bytes.

    ``cuda_device`` is the *process's* CUDA ordinal as torch prints it ("GPU
    0"), not an NVML index: map it with :func:`trainmedic.gpu.visible.nvml_gpu_for_cuda_device`.
    """
    out: dict[str, Any] = {}
    if m := _OOM_NEW_RE.search(text):
        out.update(
            requested_bytes=_bytes(m[1], m[2]),
            cuda_device=int(m[3]),
            total_bytes=_bytes(m[4], m[5]),
            free_bytes=_bytes(m[6], m[7]),
        )
    elif m := _OOM_OLD_RE.search(text):
        out.update(
            requested_bytes=_bytes(m[1], m[2]),
            cuda_device=int(m[3]),
            total_bytes=_bytes(m[4], m[5]),
            allocated_bytes=_bytes(m[6], m[7]),
            free_bytes=_bytes(m[8], m[9]),
            reserved_bytes=_bytes(m[10], m[11]),
        )
    if m := _OOM_UNALLOCATED_RE.search(text):
        out["reserved_unallocated_bytes"] = _bytes(m[1], m[2])
    if m := _OOM_ALLOCATED_RE.search(text):
        out["allocated_bytes"] = _bytes(m[1], m[2])
    return out


# ----------------------------------------------------------------------- fabric manager

FABRIC_MANAGER_DOWN_RE = re.compile(
    r"cudaErrorSystemNotReady|CUDA_ERROR_SYSTEM_NOT_READY"
    # "Error 802: system not yet initialized", "CUDA error: system not yet initialized",
    # ggml's "failed to initialize CUDA: system not yet initialized"; other programs
    # (a logging library) say "system not yet initialized" too, so CUDA, NCCL or the
    # code must come first on the line.
    r"|(?:cuda|nccl|\b802\b).*system not yet initiali[sz]ed"
    # "cuda runtime error (802)", "cudaGetDeviceCount returned 802", "code=802(",
    # "CUDA initialization failure with error: 802": 802 as the error's code, not any
    # number on a line that mentions CUDA ("step 802 on cuda:0").
    r"|cuda.*\b(?:error|returned|code)\W{0,3}802\b",
    re.IGNORECASE,
)
"""A line with CUDA error 802 (``cudaErrorSystemNotReady``, "system not yet
initialized"): on an NVSwitch machine, CUDA refusing to start because the
Fabric Manager is not running."""

FABRIC_MANAGER_FIX = (
    "CUDA cannot start on this machine (error 802, cudaErrorSystemNotReady): on NVSwitch "
    "machines (HGX, DGX) CUDA waits until the Fabric Manager has set up the NVLink fabric. "
    "Check it with systemctl status nvidia-fabricmanager (and journalctl -u "
    "nvidia-fabricmanager for why it stopped); start it with sudo systemctl start "
    "nvidia-fabricmanager and enable it at boot (sudo systemctl enable nvidia-fabricmanager); "
    "its version must match the driver's (nvidia-smi). Until it runs, every GPU of the node "
    "fails the same way: run the job on another machine."
)
"""What to do when :func:`is_fabric_manager_down` (doctor's fabric check may share it)."""


def is_fabric_manager_down(text: str) -> bool:
    """Whether ``text`` (a line) reports CUDA error 802, the Fabric Manager not running."""
    return FABRIC_MANAGER_DOWN_RE.search(text) is not None
