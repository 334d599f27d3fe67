"""Framework settings visible before a run: /dev/shm and the environment torch reads.

Only settings that cost speed or break the job are flagged; switches that
change only what an error prints (``TORCH_SHOW_CPP_STACKTRACES``,
``NCCL_DEBUG=INFO``) are left alone. CUDA settings are judged only when the
machine has GPUs. Thresholds and reasoning: docs/doctor-checks.md, section
"framework_config".
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trainmedic.doctor.facts import MachineFacts
from trainmedic.findings.fixes import SHM_FIX
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.host.types import SHM_MIN_BYTES

_MIB = float(1 << 20)


SHM_MIN_FREE_BYTES = 1 << 30
"""Free space below which a large /dev/shm is still too full to pass batches."""

_SHM_FIX = SHM_FIX

ALLOC_CONF_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")

_BOOL_KEYS = frozenset(
    {
        "expandable_segments",
        "release_lock_on_cudamalloc",
        "release_lock_on_hipmalloc",
        "pinned_use_cuda_host_register",
        "pinned_use_hip_host_register",
        "pinned_use_background_threads",
        "graph_capture_record_stream_reuse",
    }
)
_COUNT_KEYS = frozenset(
    {
        "max_non_split_rounding_mb",
        "pinned_num_register_threads",
        "pinned_max_round_threshold_mb",
        "pinned_max_cached_size_mb",
        "pinned_reserve_segment_size_mb",
    }
)
_KNOWN_KEYS = (
    _BOOL_KEYS
    | _COUNT_KEYS
    | {
        "max_split_size_mb",
        "garbage_collection_threshold",
        "roundup_power2_divisions",
        "backend",
        "per_process_memory_fraction",
        "pinned_free_catch_all",
        "throw_on_cudamalloc_oom",
    }
)
"""Keys torch's caching allocator accepts (union over releases up to 2.9+).
Newer releases add keys, so an unknown key is only flagged when it looks
like a misspelling of a known one."""

MAX_SPLIT_SIZE_MIN_MB = 20
"""torch rejects ``max_split_size_mb`` below its 20 MiB large-block size."""


def check_shm(facts: MachineFacts) -> list[Finding]:
    """A /dev/shm too small (or too full) for DataLoader workers to pass batches."""
    shm = facts.host.shm
    if shm is None or shm.total_bytes is None:
        return []
    evidence = {
        "path": shm.path,
        "shm_total_mib": round(shm.total_bytes / _MIB, 1),
        "shm_free_mib": round(shm.free_bytes / _MIB, 1) if shm.free_bytes is not None else None,
        "threshold_mib": round(SHM_MIN_BYTES / _MIB),
    }
    detail = (
        "DataLoader workers hand every batch to the main process through shared memory; when "
        "it is full they die with 'bus error' or 'No space left on device', or torch "
        "reports 'DataLoader worker (pid N) is killed by signal: Bus error'."
    )
    if shm.total_bytes < SHM_MIN_BYTES:
        return [
            Finding(
                id="framework_config.shm.small",
                category=Category.FRAMEWORK_CONFIG,
                severity=Severity.WARNING,
                title=f"{shm.path} is only {shm.total_bytes / _MIB:.0f} MiB",
                evidence=evidence,
                detail=detail,
                fix=_SHM_FIX,
                impact=None,
                subject="host",
            )
        ]
    if shm.free_bytes is not None and shm.free_bytes < SHM_MIN_FREE_BYTES:
        return [
            Finding(
                id="framework_config.shm.full",
                category=Category.FRAMEWORK_CONFIG,
                severity=Severity.WARNING,
                title=(
                    f"{shm.path} has only {shm.free_bytes / _MIB:.0f} MiB free of "
                    f"{shm.total_bytes / _MIB:.0f} MiB"
                ),
                evidence=evidence,
                detail=detail
                + " Files left by crashed jobs or other users' processes keep it full.",
                fix=(
                    f"See what fills it (ls -la {shm.path}) and remove stale files of "
                    "finished jobs; or " + _SHM_FIX[0].lower() + _SHM_FIX[1:]
                ),
                impact=None,
                subject="host",
            )
        ]
    return []


def _enabled(value: str | None) -> bool:
    """An integer switch (CUDA and NCCL read them with atoi) set to non-zero."""
    if value is None:
        return False
    text = value.strip()
    return text.lstrip("+-").isdigit() and int(text) != 0


@dataclass(frozen=True)
class EnvSwitch:
    """An environment variable that slows training when it is on: one row of the table.

    Attributes:
        var: the variable.
        key: the finding id's suffix (``framework_config.env.<key>``).
        on: whether a value turns it on.
        min_gpus: GPUs the machine needs for it to matter.
        evidence: extra evidence from the facts (the GPU count where it is the point).
    """

    var: str
    key: str
    on: Callable[[str], bool]
    min_gpus: int
    severity: Severity
    title: str
    detail: str
    fix: str
    count_gpus: bool = False


ENV_SWITCHES: tuple[EnvSwitch, ...] = (
    EnvSwitch(
        "CUDA_LAUNCH_BLOCKING",
        "cuda_launch_blocking",
        _enabled,
        1,
        Severity.WARNING,
        "CUDA_LAUNCH_BLOCKING is on: every kernel launch waits for the GPU to finish",
        "A debugging switch: the CPU can no longer queue work ahead of the GPU, so the "
        "GPU idles between kernels while Python prepares the next one. Models of many "
        "small kernels slow down several times.",
        "unset CUDA_LAUNCH_BLOCKING (keep it for debugging a CUDA error only).",
    ),
    EnvSwitch(
        "PYTORCH_NO_CUDA_MEMORY_CACHING",
        "no_cuda_memory_caching",
        lambda v: v.strip() != "0",
        1,
        Severity.WARNING,
        "PYTORCH_NO_CUDA_MEMORY_CACHING is set: every tensor is a cudaMalloc/cudaFree",
        "A debugging switch (for compute-sanitizer): without the cache each allocation "
        "calls cudaMalloc and each free calls cudaFree, which synchronises the device; "
        "training steps slow down many times. Older torch releases turn it on for any "
        "value, newer ones for 1.",
        "unset PYTORCH_NO_CUDA_MEMORY_CACHING.",
    ),
    EnvSwitch(
        "TORCH_DISTRIBUTED_DEBUG",
        "distributed_debug_detail",
        lambda v: v.strip().upper() == "DETAIL",
        0,
        Severity.WARNING,
        "TORCH_DISTRIBUTED_DEBUG=DETAIL checks every collective call at run time",
        "DETAIL wraps process groups to verify that all ranks issue matching "
        "collectives, an extra exchange per call, and logs runtime statistics; "
        "PyTorch documents it as a debugging aid that costs performance.",
        "unset TORCH_DISTRIBUTED_DEBUG (or set it to OFF) outside debugging sessions.",
    ),
    EnvSwitch(
        "NCCL_P2P_DISABLE",
        "nccl_p2p_disabled",
        _enabled,
        2,
        Severity.INFO,
        "NCCL_P2P_DISABLE is on: GPUs exchange data through host memory",
        "Without peer-to-peer transfers over NVLink or PCIe, all-reduce goes through "
        "host shared memory and is several times slower on NVLink machines. It is "
        "often set on purpose to work around hangs where P2P is broken (some consumer "
        "GPUs, VMs with an IOMMU).",
        "Unless it works around a P2P hang here, unset NCCL_P2P_DISABLE; check what P2P "
        "the GPUs support with `nvidia-smi topo -p2p r`.",
        count_gpus=True,
    ),
)
"""Debugging and workaround switches that cost speed, in the order doctor checks them."""


def check_env_switch(switch: EnvSwitch, facts: MachineFacts) -> list[Finding]:
    """The finding of ``switch`` when it is on and the machine has the GPUs it needs."""
    value = facts.host.env.get(switch.var)
    gpus = len(facts.gpu.samples)
    if value is None or gpus < switch.min_gpus or not switch.on(value):
        return []
    evidence: dict[str, Any] = {switch.var.lower(): value}
    if switch.count_gpus:
        evidence["gpu_count"] = gpus
    return [
        Finding(
            id=f"framework_config.env.{switch.key}",
            category=Category.FRAMEWORK_CONFIG,
            severity=switch.severity,
            title=switch.title,
            evidence=evidence,
            detail=switch.detail,
            fix=switch.fix,
            impact=None,
            subject="host",
        )
    ]


def switch_check(var: str) -> Callable[[MachineFacts], list[Finding]]:
    """The check of the row of :data:`ENV_SWITCHES` for ``var``, as a doctor check."""
    row = next(s for s in ENV_SWITCHES if s.var == var)

    def check(facts: MachineFacts) -> list[Finding]:
        return check_env_switch(row, facts)

    check.__name__ = f"check_{row.key}"
    check.__doc__ = row.title
    return check


@dataclass(frozen=True)
class AllocConfProblem:
    """One entry of an allocator configuration torch would reject."""

    entry: str
    problem: str


def alloc_conf_problems(value: str) -> tuple[list[AllocConfProblem], list[str]]:
    """Entries torch rejects, and unknown keys that are not likely misspellings.

    Tokenised as torch does: ``,`` separates entries, ``:`` a key from its
    value, ``[...]`` holds a list value, whitespace is ignored.
    """
    problems: list[AllocConfProblem] = []
    unknown: list[str] = []
    for entry in _split_entries(value):
        if not entry:
            continue  # torch accepts empty entries, e.g. a trailing comma
        key, sep, raw = entry.partition(":")
        key, raw = key.strip(), raw.strip()
        if not key or not sep or not raw:
            problems.append(AllocConfProblem(entry, "expected key:value"))
            continue
        if key not in _KNOWN_KEYS:
            close = difflib.get_close_matches(key, sorted(_KNOWN_KEYS), n=1, cutoff=0.8)
            if close:
                problems.append(
                    AllocConfProblem(entry, f"unknown key '{key}' (did you mean '{close[0]}'?)")
                )
            else:
                unknown.append(key)
            continue
        problem = _value_problem(key, raw)
        if problem is not None:
            problems.append(AllocConfProblem(entry, problem))
    return problems, unknown


def _split_entries(value: str) -> list[str]:
    entries: list[str] = []
    depth = 0
    current = ""
    for ch in value:
        if ch.isspace():
            continue
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        if ch == "," and depth == 0:
            entries.append(current)
            current = ""
        else:
            current += ch
    entries.append(current)
    return entries


def _value_problem(key: str, raw: str) -> str | None:
    if key in _BOOL_KEYS:
        return None if raw in ("True", "False") else "expects True or False (capitalised)"
    if key in _COUNT_KEYS:
        return None if raw.isdigit() else "expects a whole number"
    if key == "max_split_size_mb":
        if not raw.isdigit():
            return "expects a whole number of MiB"
        if int(raw) < MAX_SPLIT_SIZE_MIN_MB:
            return f"must be at least {MAX_SPLIT_SIZE_MIN_MB} (MiB)"
        return None
    if key == "garbage_collection_threshold":
        number = _float(raw)
        if number is None or not 0.0 < number < 1.0:
            return "expects a fraction between 0 and 1"
        return None
    if key == "per_process_memory_fraction":
        number = _float(raw)
        if number is None or not 0.0 < number <= 1.0:
            return "expects a fraction between 0 and 1"
        return None
    if key == "backend":
        if raw not in ("native", "cudaMallocAsync", "hipMallocAsync"):
            return "expects native or cudaMallocAsync"
        return None
    if key == "roundup_power2_divisions":
        if raw.isdigit() or (raw.startswith("[") and raw.endswith("]")):
            return None
        return "expects a whole number or a [size:divisions,...] list"
    return None


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def check_alloc_conf(facts: MachineFacts) -> list[Finding]:
    """Report the caching allocator's configuration; flag entries torch rejects."""
    if not facts.gpu.samples:
        return []
    out: list[Finding] = []
    for name in ALLOC_CONF_VARS:
        value = facts.host.env.get(name)
        if value is None:
            continue
        problems, unknown = alloc_conf_problems(value)
        evidence: dict[str, object] = {name.lower(): value}
        if unknown:
            evidence["unrecognised_keys"] = unknown
        if problems:
            out.append(
                Finding(
                    id="framework_config.env.alloc_conf_invalid",
                    category=Category.FRAMEWORK_CONFIG,
                    severity=Severity.WARNING,
                    title=(
                        f"{name} has {len(problems)} entr{'y' if len(problems) == 1 else 'ies'} "
                        "torch rejects: " + "; ".join(f"'{p.entry}' {p.problem}" for p in problems)
                    ),
                    evidence={
                        **evidence,
                        "invalid_entries": [f"{p.entry}: {p.problem}" for p in problems],
                    },
                    detail=(
                        "torch parses the setting at the first CUDA allocation and stops the "
                        "job there with a RuntimeError or ValueError."
                    ),
                    fix=f"Correct or remove the listed entries of {name}.",
                    impact=None,
                    subject="host",
                )
            )
        else:
            out.append(
                Finding(
                    id="framework_config.env.alloc_conf",
                    category=Category.FRAMEWORK_CONFIG,
                    severity=Severity.INFO,
                    title=f"torch's CUDA caching allocator is configured: {name}={value}",
                    evidence=evidence,
                    detail=(
                        "Keys not known to this version of trainmedic are listed; a torch that "
                        "does not know them either stops at the first CUDA allocation."
                        if unknown
                        else None
                    ),
                    fix="Nothing to change; keep it in mind when comparing runs.",
                    impact=None,
                    subject="host",
                )
            )
    return out


CHECKS = (
    check_shm,
    *(switch_check(row.var) for row in ENV_SWITCHES),
    check_alloc_conf,
)
