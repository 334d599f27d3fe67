"""What GPUs this machine has, as info findings, and whether a driver sees them.

docs/doctor-checks.md, "inventory", explains the findings.
"""

from __future__ import annotations

from trainmedic.doctor.facts import MachineFacts
from trainmedic.findings.gpu_faults import mig_finding
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.gpu import faults
from trainmedic.gpu.types import GpuSample

_GIB = float(1 << 30)


def _gib(value: int | None) -> float | None:
    return None if value is None else round(value / _GIB, 1)


def _capability(s: GpuSample) -> str | None:
    cc = s.compute_capability
    return None if cc is None else f"{cc[0]}.{cc[1]}"


def check_gpu_inventory(facts: MachineFacts) -> list[Finding]:
    """One info finding per GPU: model, memory, driver, compute capability."""
    driver = facts.gpu.driver
    driver_version = driver.version if driver is not None else None
    cuda = driver.cuda_version if driver is not None else None
    out: list[Finding] = []
    for s in facts.gpu.samples:
        memory = _gib(s.memory_total_bytes)
        parts = [s.name]
        if memory is not None:
            parts.append(f"{memory:.1f} GiB")
        if s.compute_capability is not None:
            parts.append(f"compute capability {_capability(s)}")
        out.append(
            Finding(
                id="inventory.gpu",
                category=Category.GPU_CAPACITY,
                severity=Severity.INFO,
                title=f"GPU {s.index}: " + ", ".join(parts),
                evidence={
                    "name": s.name,
                    "uuid": s.uuid,
                    "pci_bus_id": s.pci_bus_id,
                    "mig_mode": s.mig_mode,
                    "memory_total_gib": memory,
                    "driver_version": driver_version,
                    "cuda_driver_version": None if cuda is None else f"{cuda[0]}.{cuda[1]}",
                    "compute_capability": _capability(s),
                    "persistence_mode": s.persistence_mode,
                    "fabric": s.fabric,
                    # Readings the driver refused (common inside containers): the
                    # checks that need them are silent for this GPU.
                    "unavailable_readings": s.unavailable,
                    "backend": facts.gpu.backend,
                },
                subject=f"gpu{s.index}",
            )
        )
    return out


def check_driver_presence(facts: MachineFacts) -> list[Finding]:
    """No driver at all (info), or a driver that sees no GPU (warning)."""
    if facts.gpu.samples:
        return []
    if facts.gpu.driver is None:
        return [
            Finding(
                id="inventory.no_gpu",
                category=Category.DRIVER,
                severity=Severity.INFO,
                title="No NVIDIA driver is present: this machine has no usable NVIDIA GPU",
                evidence={
                    "reason": facts.gpu.absent_reason or "no NVIDIA driver",
                    "backend": facts.gpu.backend,
                },
                fix=(
                    "Nothing to do on a CPU-only machine. If it should have NVIDIA GPUs: "
                    "check lspci | grep -i nvidia lists them, install the NVIDIA driver "
                    "(e.g. sudo ubuntu-drivers install, or the distribution's nvidia-driver "
                    "package), reboot, and confirm with nvidia-smi; inside a container, start "
                    "it with GPU access (docker run --gpus all, NVIDIA Container Toolkit)."
                ),
                subject="host",
            )
        ]
    version = f" {facts.gpu.driver.version}" if facts.gpu.driver.version else ""
    return [
        Finding(
            id="inventory.driver_without_gpu",
            category=Category.DRIVER,
            severity=Severity.WARNING,
            title=f"The NVIDIA driver{version} is loaded but shows no GPU",
            evidence={
                "driver_version": facts.gpu.driver.version,
                "backend": facts.gpu.backend,
            },
            fix=(
                f"Run nvidia-smi and check dmesg for Xid 79 ({faults.xid_meaning(79)}): "
                "then the GPU needs a reboot or reseat; inside a container, check it was "
                "started with GPU access (docker run --gpus all) and that "
                "NVIDIA_VISIBLE_DEVICES is not 'none' or 'void'."
            ),
            subject="host",
        )
    ]


def check_mixed_models(facts: MachineFacts) -> list[Finding]:
    """GPUs of different models: data-parallel training runs at the slowest one's pace."""
    names = sorted({s.name for s in facts.gpu.samples})
    if len(names) < 2:
        return []
    return [
        Finding(
            id="inventory.mixed_gpu_models",
            category=Category.GPU_CAPACITY,
            severity=Severity.WARNING,
            title=(
                f"This machine mixes {len(names)} GPU models; training across all of them "
                "runs at the pace of the slowest"
            ),
            evidence={
                "models": {
                    name: [f"gpu{s.index}" for s in facts.gpu.samples if s.name == name]
                    for name in names
                },
            },
            fix=(
                "Train on GPUs of one model (CUDA_DEVICE_ORDER=PCI_BUS_ID "
                "CUDA_VISIBLE_DEVICES=<their indices>); the evidence lists which GPU "
                "has which model."
            ),
            subject="host",
        )
    ]


def check_persistence_mode(facts: MachineFacts) -> list[Finding]:
    """Persistence mode off: each CUDA start re-initialises the GPUs (info only)."""
    off = [s for s in facts.gpu.samples if s.persistence_mode is False]
    if not off:
        return []
    gpus = [f"gpu{s.index}" for s in off]
    return [
        Finding(
            id="driver.persistence_mode_off",
            category=Category.DRIVER,
            severity=Severity.INFO,
            title=(
                f"Persistence mode is off on {len(off)} GPU(s): every process that starts "
                "CUDA waits for the GPU to initialise"
            ),
            evidence={"gpus": gpus},
            fix=(
                "Enable it: sudo systemctl enable --now nvidia-persistenced "
                "(or sudo nvidia-smi -pm 1, which lasts until reboot)."
            ),
            subject="host",
        )
    ]


def check_fabric(facts: MachineFacts) -> list[Finding]:
    """GPUs of an NVSwitch machine (HGX) not registered with the NVLink fabric.

    CUDA cannot start on them until Fabric Manager has registered them; a
    registration still in progress is a warning (it takes a minute after boot).
    """
    by_state: dict[str, list[GpuSample]] = {}
    for s in facts.gpu.samples:
        if s.fabric is None or s.fabric == "completed":
            continue
        key = "failed" if s.fabric.startswith("failed") else s.fabric
        by_state.setdefault(key, []).append(s)
    out: list[Finding] = []
    titles = {
        "not_started": (
            Severity.ERROR,
            "driver.fabric_manager_not_running",
            "{n} GPU(s) are not registered with the NVLink fabric: Fabric Manager is not "
            "running, so CUDA cannot start on them (error 802, 'system not yet initialized')",
        ),
        "failed": (
            Severity.ERROR,
            "driver.fabric_registration_failed",
            "{n} GPU(s) failed to register with the NVLink fabric: CUDA cannot start on them",
        ),
        "in_progress": (
            Severity.WARNING,
            "driver.fabric_registration_pending",
            "{n} GPU(s) are still registering with the NVLink fabric: CUDA programs started "
            "now fail with error 802 until it completes",
        ),
    }
    for key, gpus in by_state.items():
        severity, finding_id, title = titles[key]
        fix = faults.FABRIC_MANAGER_FIX  # the failure classifier's fix for error 802 too
        if key == "in_progress":
            fix = "Wait a minute and run doctor again. If it stays so: " + fix
        out.append(
            Finding(
                id=finding_id,
                category=Category.DRIVER,
                severity=severity,
                title=title.format(n=len(gpus)),
                evidence={
                    "gpus": [f"gpu{s.index}" for s in gpus],
                    "fabric": {f"gpu{s.index}": s.fabric for s in gpus},
                },
                fix=fix,
                subject="host",
            )
        )
    return out


def check_mig(facts: MachineFacts) -> list[Finding]:
    """GPUs in MIG mode, with what MIG hides from the other checks (info)."""
    return [mig_finding(s, "now") for s in facts.gpu.samples if s.mig_mode]


CHECKS = (
    check_gpu_inventory,
    check_driver_presence,
    check_mixed_models,
    check_persistence_mode,
    check_fabric,
    check_mig,
)
