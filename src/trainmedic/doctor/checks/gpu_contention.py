"""Other people's work on the GPUs: their processes, their load, their memory.

docs/doctor-checks.md, "contention (GPU)" and "gpu_memory", explains the
thresholds. A process counts as someone else's when its owner is another user,
or when its owner cannot be seen from here: NVML lists processes of every
container on the GPU, but their pids mean nothing in this pid namespace.

A GPU whose process list cannot be read (MIG without privileges, no
permission) is not judged "free": whose work it runs is unknown, and
``contention.gpu.processes_unknown`` says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainmedic.doctor.facts import MachineFacts
from trainmedic.findings.gpu_faults import processes_unknown_finding
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.gpu.types import GpuProcess, GpuSample

# Busier than this with none of the user's processes on it: someone else is
# computing. Below it, monitoring agents and brief probes (a few percent) fit.
BUSY_UTILIZATION_PCT = 20.0
# Memory held by others worth reporting: at least 1 GiB and at least 5 % of the
# GPU, so the driver's own reservation (a few hundred MiB) never counts.
OTHERS_MEMORY_MIN_BYTES = 1 << 30
OTHERS_MEMORY_MIN_SHARE = 0.05

_GIB = float(1 << 30)


@dataclass(frozen=True)
class _Split:
    """A GPU's processes split into the user's and everyone else's."""

    own: tuple[GpuProcess, ...]
    others: tuple[GpuProcess, ...]

    @property
    def invisible(self) -> tuple[GpuProcess, ...]:
        return tuple(p for p in self.others if p.user is None)


def _split(s: GpuSample, user: str) -> _Split:
    own = tuple(p for p in s.processes if p.user is not None and p.user == user)
    others = tuple(p for p in s.processes if p.user is None or p.user != user)
    return _Split(own, others)


def _describe(p: GpuProcess) -> str:
    owner = p.user if p.user is not None else "owner not visible"
    parts = [owner]
    if p.name:
        parts.append(p.name)
    if p.used_memory_bytes is not None:
        parts.append(f"{p.used_memory_bytes / _GIB:.1f} GiB")
    return f"pid {p.pid} ({', '.join(parts)})"


def _free_gpus_hint(facts: MachineFacts) -> str:
    """``CUDA_VISIBLE_DEVICES=...`` naming the GPUs nobody else uses, when any."""
    user = facts.host.user
    free = []
    for s in facts.gpu.samples:
        if s.known_processes is None or s.unreachable is not None:
            continue  # whose work runs there is unknown
        split = _split(s, user)
        # A busy GPU counts as free when the work on it is the user's own.
        idle_or_own = bool(split.own) or (s.utilization_gpu_pct or 0.0) < BUSY_UTILIZATION_PCT
        if not split.others and idle_or_own and _others_memory(s, split) < _memory_threshold(s):
            free.append(s.index)
    if not free:
        return "no GPU of this machine is free of other users' work right now"
    # NVML numbers GPUs in PCI bus order; CUDA's default order differs.
    indices = ",".join(str(i) for i in free)
    return f"CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES={indices} selects the free GPUs"


def _sharing_fix(facts: MachineFacts) -> str:
    return (
        "Run on GPUs nobody else uses: "
        + _free_gpus_hint(facts)
        + ". On a shared server, ask the owners or the scheduler for dedicated GPUs "
        "(e.g. Slurm --gres=gpu:N --exclusive; an admin can set nvidia-smi -c "
        "EXCLUSIVE_PROCESS); on a rented machine, ask the provider why others share it."
    )


def _owner_phrase(split: _Split) -> str:
    users = sorted({p.user for p in split.others if p.user is not None})
    hidden = len(split.invisible)
    parts = []
    if users:
        parts.append("user(s) " + ", ".join(users))
    if hidden:
        parts.append(f"{hidden} process(es) whose owner is not visible from here")
    return " and ".join(parts)


def check_foreign_processes(facts: MachineFacts) -> list[Finding]:
    """Compute processes of other users (or of unseen owners) on a GPU."""
    out: list[Finding] = []
    for s in facts.gpu.samples:
        split = _split(s, facts.host.user)
        if not split.others:
            continue  # none seen (an unreadable list: check_processes_unknown)
        out.append(
            Finding(
                id="contention.gpu.foreign_processes",
                category=Category.CONTENTION,
                severity=Severity.WARNING,
                title=(
                    f"GPU {s.index} runs {len(split.others)} process(es) that are not "
                    f"yours: {_owner_phrase(split)}"
                ),
                evidence={
                    "user": facts.host.user,
                    "foreign_processes": [_describe(p) for p in split.others],
                    "foreign_process_count": len(split.others),
                    "owner_not_visible_count": len(split.invisible),
                    "utilization_gpu_pct": s.utilization_gpu_pct,
                },
                detail=(
                    "A process whose owner is not visible runs in another container or pid "
                    "namespace, or belongs to a user whose processes this account may not see."
                    if split.invisible
                    else None
                ),
                fix=_sharing_fix(facts),
                impact=None,
                subject=f"gpu{s.index}",
            )
        )
    return out


def check_busy_without_user(facts: MachineFacts) -> list[Finding]:
    """A GPU computing although none of its processes is the user's.

    Impact: GPU time-slicing shares the GPU between contexts, so others take
    what they use now, and at most ``n / (n + 1)`` of it when ``n`` other
    contexts and the user's all want the whole GPU.
    """
    out: list[Finding] = []
    for s in facts.gpu.samples:
        util = s.utilization_gpu_pct
        if util is None or util < BUSY_UTILIZATION_PCT or s.known_processes is None:
            continue
        split = _split(s, facts.host.user)
        if split.own:
            continue
        n_others = max(1, len(split.others))
        impact = min(util / 100.0, n_others / (n_others + 1))
        whose = (
            _owner_phrase(split)
            if split.others
            else "no process visible from here (another container or VM)"
        )
        out.append(
            Finding(
                id="contention.gpu.busy_without_user",
                category=Category.CONTENTION,
                severity=Severity.WARNING,
                title=f"GPU {s.index} is {util:.0f}% busy with work that is not yours ({whose})",
                evidence={
                    "utilization_gpu_pct": util,
                    "busy_threshold_pct": BUSY_UTILIZATION_PCT,
                    "user": facts.host.user,
                    "foreign_processes": [_describe(p) for p in split.others],
                },
                fix=_sharing_fix(facts),
                impact=round(impact, 4),
                subject=f"gpu{s.index}",
            )
        )
    return out


def _others_memory(s: GpuSample, split: _Split) -> int:
    """Bytes of GPU memory held by anyone but the user.

    Without processes of the user, everything in use is someone else's; with
    them, the others' own figures count, or what is used beyond the user's
    when some others' figures are hidden.
    """
    used = s.memory_used_bytes or 0
    if not split.own:
        known = sum(p.used_memory_bytes or 0 for p in split.others)
        return max(used, known)
    known_others = sum(p.used_memory_bytes or 0 for p in split.others)
    hidden = any(p.used_memory_bytes is None for p in split.others)
    own_hidden = any(p.used_memory_bytes is None for p in split.own)
    if hidden and not own_hidden:
        own_bytes = sum(p.used_memory_bytes or 0 for p in split.own)
        return max(known_others, used - own_bytes)
    return known_others


def _memory_threshold(s: GpuSample) -> float:
    total = s.memory_total_bytes or 0
    return max(float(OTHERS_MEMORY_MIN_BYTES), OTHERS_MEMORY_MIN_SHARE * total)


def check_memory_used_by_others(facts: MachineFacts) -> list[Finding]:
    """GPU memory already taken by others, leaving less for the user's job."""
    out: list[Finding] = []
    for s in facts.gpu.samples:
        if s.memory_total_bytes is None or s.memory_used_bytes is None:
            continue
        if s.known_processes is None:
            continue  # the user's own share of the memory is unknown
        split = _split(s, facts.host.user)
        others = _others_memory(s, split)
        if others < _memory_threshold(s):
            continue
        total = s.memory_total_bytes
        free = s.memory_free_bytes or 0
        out.append(
            Finding(
                id="gpu_memory.used_by_others",
                category=Category.GPU_MEMORY,
                severity=Severity.WARNING,
                title=(
                    f"GPU {s.index}: {others / _GIB:.1f} GiB of {total / _GIB:.1f} GiB is "
                    f"held by others; {free / _GIB:.1f} GiB is free"
                ),
                evidence={
                    "used_by_others_gib": round(others / _GIB, 2),
                    "used_by_others_pct": round(100.0 * others / total, 1) if total else None,
                    "memory_free_gib": round(free / _GIB, 2),
                    "memory_total_gib": round(total / _GIB, 2),
                    "memory_used_gib": round(s.memory_used_bytes / _GIB, 2),
                    "foreign_processes": [_describe(p) for p in split.others],
                },
                detail=(
                    None
                    if split.others
                    else "No process is listed for this memory: its owner runs in another "
                    "container or VM that this machine's driver does not list processes for."
                ),
                fix=_sharing_fix(facts)
                + " If you must share, size the job for the free memory (smaller micro-batch "
                "with gradient accumulation) so it does not fail with out-of-memory.",
                impact=None,
                subject=f"gpu{s.index}",
            )
        )
    return out


def check_processes_unknown(facts: MachineFacts) -> list[Finding]:
    """GPUs whose process list cannot be read: the checks above cannot see others there."""
    return [
        processes_unknown_finding(s, "now")
        for s in facts.gpu.samples
        if s.known_processes is None and s.unreachable is None and not s.mig_mode
    ]


CHECKS = (
    check_foreign_processes,
    check_busy_without_user,
    check_memory_used_by_others,
    check_processes_unknown,
)
