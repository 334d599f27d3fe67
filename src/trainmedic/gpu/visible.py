"""Which NVML GPU a process's CUDA device is.

torch names GPUs by the process's CUDA ordinal ("GPU 0" in an out-of-memory
message, ``cuda:1``), which counts only the devices ``CUDA_VISIBLE_DEVICES``
leaves, in ``CUDA_DEVICE_ORDER``; NVML and ``nvidia-smi`` number every GPU
in PCI bus order. :func:`nvml_gpu_for_cuda_device` maps one to the other and
says "unknown" rather than guess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from trainmedic.gpu.types import GpuSample


def visible_entries(env: Mapping[str, str]) -> list[str] | None:
    """``CUDA_VISIBLE_DEVICES`` as CUDA reads it, or ``None`` when it is unset.

    CUDA stops at the first entry it cannot parse (a negative index, say):
    that entry and all after it are ignored.
    """
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    out: list[str] = []
    for entry in (e.strip() for e in raw.split(",")):
        if not entry:
            continue
        if entry.isdigit() or entry.startswith(("GPU-", "MIG-")):
            out.append(entry)
        else:
            break
    return out


def nvml_gpu_for_cuda_device(
    ordinal: int, env: Mapping[str, str], gpus: Sequence[GpuSample]
) -> GpuSample | None:
    """The NVML GPU behind CUDA device ``ordinal`` of a process started with ``env``.

    ``None`` when it cannot be told: an ordinal beyond the visible devices, a
    UUID no GPU has, or an index under CUDA's default fastest-first order on
    a machine whose GPUs differ (CUDA then orders them by speed, not by bus).
    """
    if ordinal < 0 or not gpus:
        return None
    entries = visible_entries(env)
    if entries is None:
        token = str(ordinal)
    elif ordinal < len(entries):
        token = entries[ordinal]
    else:
        return None
    if token.startswith("GPU-"):
        return next((g for g in gpus if g.uuid and g.uuid.lower().startswith(token.lower())), None)
    if token.startswith("MIG-"):
        return _mig_parent(token, gpus)
    if any(g.mig_mode for g in gpus):
        return None  # CUDA enumerates MIG instances, not GPUs, by index
    by_bus = sorted(gpus, key=lambda g: g.index)
    position = int(token)
    if position >= len(by_bus):
        return None
    order = env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST").strip().upper()
    # Fastest-first breaks ties by PCI bus id: with one model it is the bus order.
    if order != "PCI_BUS_ID" and len({g.name for g in gpus}) > 1:
        return None
    return by_bus[position]


def _mig_parent(token: str, gpus: Sequence[GpuSample]) -> GpuSample | None:
    wanted = token.lower()
    for g in gpus:
        for m in g.mig_devices:
            if m.uuid and m.uuid.lower().startswith(wanted):
                return g
    # The older form names the parent: MIG-GPU-<uuid>/<gi>/<ci>.
    if wanted.startswith("mig-gpu-"):
        parent = wanted[len("mig-") :].split("/", 1)[0]
        return next((g for g in gpus if g.uuid and g.uuid.lower() == parent), None)
    return None
