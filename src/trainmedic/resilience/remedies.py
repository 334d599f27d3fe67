"""Cause-aware remedies: what to change for the next attempt, and why.

A :class:`Remedy` is a pure transform of the next attempt's environment plus
a log line that names the evidence. :func:`plan_remedies` picks them from the
classification of the failed attempt and the environment it ran with, so
remedies escalate by themselves (a micro-batch divisor of 2 becomes 4):

- ``CUDA_OOM``: ``micro_batch`` (``TRAINMEDIC_MICRO_BATCH_DIVISOR`` ×2, up to
  16, and ``TRAINMEDIC_GRAD_ACCUM`` to match) and ``expandable_segments``
  (merged into ``PYTORCH_CUDA_ALLOC_CONF``, or ``PYTORCH_ALLOC_CONF`` when the
  job uses that newer name; not for TensorFlow's or XLA's out-of-memory errors).
- DataLoader worker death from shared memory, a killed worker, host OOM:
  ``fewer_workers`` (``TRAINMEDIC_MAX_NUM_WORKERS`` halved).
- DataLoader file-descriptor exhaustion: ``file_system_sharing``
  (``TRAINMEDIC_SHARING_STRATEGY=file_system``).
- A GPU with a hardware fault: ``exclude_gpu`` (``CUDA_VISIBLE_DEVICES``
  rewritten without it).
- A collective timeout: ``nccl_debug`` (``NCCL_DEBUG=WARN``) so that the next
  failure explains itself.

Scripts read the ``TRAINMEDIC_*`` variables through :mod:`trainmedic.remedy_api`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from trainmedic.remedy_api import (
    GRAD_ACCUM_ENV,
    MAX_NUM_WORKERS_ENV,
    MICRO_BATCH_DIVISOR_ENV,
    SHARING_STRATEGY_ENV,
)
from trainmedic.resilience.classify import Classification, FailureClass, GpuRef

MAX_MICRO_BATCH_DIVISOR = 16
DEFAULT_WORKERS_AFTER_SHM_FAILURE = 2
"""Worker cap when the failed attempt's ``num_workers`` is unknown."""

ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"
ALLOC_CONF_NEW_ENV = "PYTORCH_ALLOC_CONF"  # torch >= 2.9 reads this first
_EXPANDABLE_MIN_TORCH = (2, 1)


@dataclass(frozen=True)
class Remedy:
    """One change to the next attempt's environment.

    Attributes:
        name: stable name (``micro_batch``, ``expandable_segments``,
            ``fewer_workers``, ``file_system_sharing``, ``exclude_gpu``, ``nccl_debug``).
        reason: why, naming the evidence, for the log and the report.
        set_env: variables to set.
        unset_env: variables to remove.
    """

    name: str
    reason: str
    set_env: Mapping[str, str] = field(default_factory=dict)
    unset_env: tuple[str, ...] = ()

    def apply(self, env: Mapping[str, str]) -> dict[str, str]:
        """The environment with this remedy applied (``env`` is not modified)."""
        out = {k: v for k, v in env.items() if k not in self.unset_env}
        out.update(self.set_env)
        return out

    @property
    def log_line(self) -> str:
        changes = [f"{k}={v}" for k, v in self.set_env.items()]
        changes += [f"unset {k}" for k in self.unset_env]
        return f"remedy {self.name}: {', '.join(changes)} — {self.reason}"


def apply_remedies(env: Mapping[str, str], remedies: Sequence[Remedy]) -> dict[str, str]:
    """``env`` with every remedy applied in order."""
    out = dict(env)
    for remedy in remedies:
        out = remedy.apply(out)
    return out


def plan_remedies(
    c: Classification,
    env: Mapping[str, str],
    *,
    gpus: Sequence[GpuRef] = (),
    torch_version: str | None = None,
) -> list[Remedy]:
    """The remedies for the next attempt after failure ``c``.

    Args:
        env: the environment the failed attempt ran with.
        gpus: the machine's GPUs (index, UUID, PCI bus id) from NVML, used to
            rewrite ``CUDA_VISIBLE_DEVICES``.
        torch_version: the job's torch version when known (``expandable_segments``
            needs 2.1 or newer).
    """
    fc = c.failure_class
    out: list[Remedy | None] = []
    if fc is FailureClass.CUDA_OOM:
        out.append(_micro_batch(c, env))
        if c.details.get("framework") not in ("tensorflow", "xla"):
            # torch's allocator setting: TensorFlow's allocator never reads it.
            out.append(_expandable_segments(c, env, torch_version))
    elif fc is FailureClass.DATALOADER_WORKER_DIED:
        cause = c.details.get("cause")
        if cause == "fd_limit":
            out.append(_file_system_sharing(env))
        elif cause in ("shm", "killed"):
            out.append(_fewer_workers(c, env))
    elif fc in (FailureClass.HOST_OOM_KILL, FailureClass.HOST_ALLOC_FAILURE):
        if c.details.get("num_workers") or env.get(MAX_NUM_WORKERS_ENV):
            out.append(_fewer_workers(c, env))
    elif fc is FailureClass.CUDA_ERROR and c.details.get("hardware") and c.gpu is not None:
        out.append(exclude_gpu(c.gpu, env, gpus, why=c.why))
    elif fc is FailureClass.COLLECTIVE_TIMEOUT and not env.get("NCCL_DEBUG"):
        out.append(
            Remedy(
                "nccl_debug",
                "a collective timed out: NCCL will log its own view of the next failure",
                {"NCCL_DEBUG": "WARN"},
            )
        )
    return [r for r in out if r is not None]


# ------------------------------------------------------------------ GPU memory


def _int_env(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(env.get(name, "").strip() or default)
    except ValueError:
        return default


def _micro_batch(c: Classification, env: Mapping[str, str]) -> Remedy | None:
    divisor = max(1, _int_env(env, MICRO_BATCH_DIVISOR_ENV, 1))
    if divisor >= MAX_MICRO_BATCH_DIVISOR:
        return None
    new = min(divisor * 2, MAX_MICRO_BATCH_DIVISOR)
    return Remedy(
        "micro_batch",
        f"{c.why}: micro-batch divided by {new} with {new}x gradient accumulation keeps the "
        "effective batch (applied by scripts that call trainmedic.micro_batch_plan())",
        {MICRO_BATCH_DIVISOR_ENV: str(new), GRAD_ACCUM_ENV: str(new)},
    )


def _parse_alloc_conf(value: str) -> list[tuple[str, str]]:
    pairs = []
    for item in value.split(","):
        if item.strip():
            key, _, val = item.partition(":")
            pairs.append((key.strip(), val.strip()))
    return pairs


def _version_tuple(version: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m[1]), int(m[2])) if m else None


def _expandable_segments(
    c: Classification, env: Mapping[str, str], torch_version: str | None
) -> Remedy | None:
    if torch_version is not None:
        parsed = _version_tuple(torch_version)
        if parsed is not None and parsed < _EXPANDABLE_MIN_TORCH:
            return None
    for var in (ALLOC_CONF_NEW_ENV, ALLOC_CONF_ENV):
        pairs = dict(_parse_alloc_conf(env.get(var, "")))
        # Already chosen either way (an explicit False is the user's decision),
        # or the cudaMallocAsync backend, which has no expandable segments.
        if "expandable_segments" in pairs or pairs.get("backend") == "cudaMallocAsync":
            return None
    var = ALLOC_CONF_NEW_ENV if env.get(ALLOC_CONF_NEW_ENV, "").strip() else ALLOC_CONF_ENV
    existing = env.get(var, "").strip().strip(",")
    value = f"{existing},expandable_segments:True" if existing else "expandable_segments:True"
    unallocated = c.details.get("reserved_unallocated_bytes")
    why = "CUDA out of memory: expandable segments let the allocator grow blocks instead of "
    why += "fragmenting"
    if unallocated:
        why += f" ({unallocated / 2**20:.0f} MiB was reserved but unallocated)"
    return Remedy("expandable_segments", why, {var: value})


# ----------------------------------------------------------------- data loading


def _fewer_workers(c: Classification, env: Mapping[str, str]) -> Remedy | None:
    known = [
        n
        for n in (c.details.get("num_workers"), _int_env(env, MAX_NUM_WORKERS_ENV, -1))
        if isinstance(n, int) and n >= 0
    ]
    if known:
        current = min(known)
        if current == 0:
            return None
        new = current // 2
    else:
        new = DEFAULT_WORKERS_AFTER_SHM_FAILURE
    cause = {
        "shm": "shared memory (/dev/shm) ran out",
        "killed": "a worker was killed, usually for host memory",
    }.get(str(c.details.get("cause")), "host memory ran out")
    was = f" (was {min(known)})" if known else ""
    return Remedy(
        "fewer_workers",
        f"{cause}: each DataLoader worker holds its own batches and dataset copy; "
        f"at most {new} workers{was}, applied by scripts that call trainmedic.max_num_workers()",
        {MAX_NUM_WORKERS_ENV: str(new)},
    )


def _file_system_sharing(env: Mapping[str, str]) -> Remedy | None:
    if env.get(SHARING_STRATEGY_ENV, "").strip() == "file_system":
        return None
    return Remedy(
        "file_system_sharing",
        "DataLoader workers ran out of file descriptors: the file_system strategy shares "
        "tensors by name instead of one descriptor each",
        {SHARING_STRATEGY_ENV: "file_system"},
    )


# ------------------------------------------------------------------ GPU exclusion


def exclude_gpu(
    faulty: GpuRef, env: Mapping[str, str], gpus: Sequence[GpuRef], *, why: str = ""
) -> Remedy | None:
    """Rewrite ``CUDA_VISIBLE_DEVICES`` without ``faulty``; ``None`` when impossible.

    Remaining GPUs are written as UUIDs when known, which mean the same GPU
    whatever ``CUDA_DEVICE_ORDER`` is; indexes are written with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that they mean nvidia-smi's order.
    Impossible when the GPU cannot be identified among the visible ones or is
    the only one left.
    """
    visible = _visible_gpus(env, gpus)
    if visible is None:
        return None
    keep = [g for g in visible if not g.same_gpu(_resolve(faulty, gpus))]
    if len(keep) == len(visible) or not keep:
        return None
    entries = [g.uuid if g.uuid else str(g.index) for g in keep]
    set_env = {"CUDA_VISIBLE_DEVICES": ",".join(entries)}
    if any(not g.uuid for g in keep):
        set_env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    reason = f"{why}: " if why else ""
    reason += (
        f"{_resolve(faulty, gpus)} is left out; a job that starts one process per GPU must "
        "follow the visible count (torchrun --nproc-per-node=gpu)"
    )
    return Remedy("exclude_gpu", reason, set_env)


def _resolve(ref: GpuRef, gpus: Sequence[GpuRef]) -> GpuRef:
    """The inventory entry for ``ref`` (all identities known), or ``ref`` itself."""
    return next((g for g in gpus if g.same_gpu(ref)), ref)


def _visible_gpus(env: Mapping[str, str], gpus: Sequence[GpuRef]) -> list[GpuRef] | None:
    """The GPUs the attempt could see, or ``None`` when that cannot be told."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return list(gpus) if gpus else None
    visible = []
    for entry in (e.strip() for e in raw.split(",")):
        if not entry:
            continue
        if entry.lstrip("-").isdigit():
            index = int(entry)
            if index < 0:
                break  # CUDA ignores this entry and everything after it
            visible.append(next((g for g in gpus if g.index == index), GpuRef(index=index)))
        elif entry.startswith("GPU-"):
            found = next((g for g in gpus if g.uuid and g.uuid.startswith(entry)), None)
            visible.append(found or GpuRef(uuid=entry))
        else:
            return None  # MIG instances and other forms: leave the setting alone
    return visible
