"""Does the installed torch fit this machine's driver and GPUs?

docs/doctor-checks.md, "driver", explains each rule. Checks that need facts
only an imported torch gives (architecture list, cuDNN, CUDA availability)
stay quiet when ``TorchBuild.probed`` is false.
"""

from __future__ import annotations

from collections.abc import Sequence

from trainmedic.doctor.facts import MachineFacts
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.framework.torch_build import TorchBuild, arch_capability, arch_support
from trainmedic.gpu.types import GpuSample

Version = tuple[int, int]

# CUDA release -> oldest Linux driver branch that supports it natively
# (CUDA Toolkit release notes, "CUDA Toolkit and Corresponding Driver Versions").
MIN_DRIVER_BRANCH: dict[Version, int] = {
    (11, 0): 450,
    (11, 1): 455,
    (11, 2): 460,
    (11, 3): 465,
    (11, 4): 470,
    (11, 5): 495,
    (11, 6): 510,
    (11, 7): 515,
    (11, 8): 520,
    (12, 0): 525,
    (12, 1): 530,
    (12, 2): 535,
    (12, 3): 545,
    (12, 4): 550,
    (12, 5): 555,
    (12, 6): 560,
    (12, 8): 570,
    (12, 9): 575,
    (13, 0): 580,
}

# CUDA variants PyTorch publishes wheels for at download.pytorch.org/whl/cuXYZ
# (each torch release offers a few of them).
TORCH_WHEEL_CUDA: tuple[Version, ...] = (
    (11, 8),
    (12, 1),
    (12, 4),
    (12, 6),
    (12, 8),
    (12, 9),
    (13, 0),
)

# Compute capability -> first CUDA release that compiles for it; a torch build
# for an older CUDA cannot contain code for the GPU.
FIRST_CUDA_FOR_CAPABILITY: dict[Version, Version] = {
    (8, 0): (11, 0),
    (8, 6): (11, 1),
    (8, 7): (11, 4),
    (8, 9): (11, 8),
    (9, 0): (11, 8),
    (10, 0): (12, 8),
    (10, 3): (12, 9),
    (11, 0): (13, 0),
    (12, 0): (12, 8),
    (12, 1): (12, 9),
}


def _v(version: Version) -> str:
    return f"{version[0]}.{version[1]}"


def _wheel_for(driver_cuda: Version) -> tuple[Version, bool] | None:
    """The PyTorch wheel CUDA variant to suggest for a driver, and whether it is native.

    The newest variant the driver supports natively; failing that, the oldest
    of the driver's CUDA major, which runs through minor-version compatibility.
    """
    native = [w for w in TORCH_WHEEL_CUDA if w <= driver_cuda]
    if native:
        return native[-1], True
    same_major = [w for w in TORCH_WHEEL_CUDA if w[0] == driver_cuda[0]]
    return (same_major[0], False) if same_major else None


def _index_url(cuda: Version) -> str:
    return f"https://download.pytorch.org/whl/cu{cuda[0]}{cuda[1]}"


def _driver_branch(cuda: Version) -> str:
    branch = MIN_DRIVER_BRANCH.get(cuda)
    if branch is None:
        newer = [b for v, b in MIN_DRIVER_BRANCH.items() if v >= cuda]
        branch = min(newer) if newer else None
    return f"the {branch} branch or newer" if branch else f"one that supports CUDA {_v(cuda)}"


def _torch_wheel_fix(driver_cuda: Version, native_only: bool) -> str:
    found = _wheel_for(driver_cuda)
    if found is None or (native_only and not found[1]):
        return ""
    wheel, native = found
    how = (
        "which this driver supports"
        if native
        else "which this driver runs through minor-version compatibility"
    )
    return (
        f"or install a torch built for CUDA {_v(wheel)}, {how}: "
        f"pip install torch --index-url {_index_url(wheel)}"
    )


def check_torch_installed(facts: MachineFacts) -> list[Finding]:
    """torch missing where GPUs exist: the build checks cannot run."""
    if facts.torch is not None or not facts.gpu.samples:
        return []
    return [
        Finding(
            id="driver.torch_not_installed",
            category=Category.DRIVER,
            severity=Severity.INFO,
            title="torch is not installed here, so doctor cannot check it against the driver",
            evidence={"gpu_count": len(facts.gpu.samples)},
            fix=(
                "Run trainmedic doctor inside the training environment (pip install "
                "trainmedic there) so it checks the torch build the training uses."
            ),
            subject="host",
        )
    ]


def check_torch_cuda_build(facts: MachineFacts) -> list[Finding]:
    """CPU-only torch on a GPU machine; torch built for a newer CUDA than the driver."""
    torch, driver = facts.torch, facts.gpu.driver
    if torch is None or not facts.gpu.samples:
        return []
    driver_cuda = driver.cuda_version if driver is not None else None
    evidence = {
        "torch_version": torch.version,
        "torch_cuda_version": _v(torch.cuda_version) if torch.cuda_version else None,
        "driver_version": driver.version if driver is not None else None,
        "driver_cuda_version": _v(driver_cuda) if driver_cuda else None,
    }
    if torch.cuda_version is None:
        found = _wheel_for(driver_cuda) if driver_cuda else None
        install = (
            f"pip install torch --index-url {_index_url(found[0])}"
            if found
            else "pip install torch (the default Linux wheel on PyPI is a CUDA build)"
        )
        return [
            Finding(
                id="driver.torch_cpu_only",
                category=Category.DRIVER,
                severity=Severity.ERROR,
                title=(
                    f"torch {torch.version} is built without CUDA (a CPU-only build); it "
                    f"cannot use this machine's {len(facts.gpu.samples)} GPU(s)"
                ),
                evidence=evidence,
                fix=f"Replace it with a CUDA build: pip uninstall torch, then {install}.",
                subject="host",
            )
        ]
    if driver_cuda is None:
        return []
    built = torch.cuda_version
    if built[0] > driver_cuda[0]:
        alternative = _torch_wheel_fix(driver_cuda, native_only=False)
        return [
            Finding(
                id="driver.cuda_newer_than_driver",
                category=Category.DRIVER,
                severity=Severity.ERROR,
                title=(
                    f"torch is built for CUDA {_v(built)} but the driver supports only CUDA "
                    f"{_v(driver_cuda)}: CUDA will not initialise"
                ),
                evidence=evidence,
                fix=(
                    f"Upgrade the NVIDIA driver to {_driver_branch(built)}"
                    + (f", {alternative}." if alternative else ".")
                ),
                subject="host",
            )
        ]
    if built[0] == driver_cuda[0] and built[1] > driver_cuda[1]:
        alternative = _torch_wheel_fix(driver_cuda, native_only=True)
        return [
            Finding(
                id="driver.cuda_minor_newer_than_driver",
                category=Category.DRIVER,
                severity=Severity.WARNING,
                title=(
                    f"torch is built for CUDA {_v(built)}, newer than the driver's CUDA "
                    f"{_v(driver_cuda)}: it runs through minor-version compatibility, but "
                    "PTX compilation and newer CUDA features can fail"
                ),
                evidence=evidence,
                fix=(
                    f"Upgrade the NVIDIA driver to {_driver_branch(built)}"
                    + (f", {alternative}." if alternative else ".")
                ),
                subject="host",
            )
        ]
    return []


def _gpu_list(samples: Sequence[GpuSample]) -> str:
    return ",".join(f"gpu{s.index}" for s in samples)


def _newer_torch_fix(capability: Version, facts: MachineFacts) -> str:
    needed = FIRST_CUDA_FOR_CAPABILITY.get(capability)
    if needed is None:
        return (
            "Install a torch build whose torch.cuda.get_arch_list() covers "
            f"sm_{capability[0]}{capability[1]} (a newer release or CUDA variant), or build "
            f"torch from source with TORCH_CUDA_ARCH_LIST={_v(capability)}."
        )
    wheel = next((w for w in TORCH_WHEEL_CUDA if w >= needed), needed)
    driver = facts.gpu.driver
    driver_cuda = driver.cuda_version if driver is not None else None
    upgrade = (
        f"upgrade the NVIDIA driver to {_driver_branch(wheel)}, then "
        if driver_cuda is None or driver_cuda < wheel
        else ""
    )
    return (
        f"This GPU needs a torch built for CUDA {_v(needed)} or newer: {upgrade}"
        f"pip install --upgrade torch --index-url {_index_url(wheel)}."
    )


def _older_torch_fix(capability: Version) -> str:
    return (
        f"This torch release no longer ships code for sm_{capability[0]}{capability[1]}: "
        "install an older torch release whose torch.cuda.get_arch_list() includes it, or "
        f"build torch from source with TORCH_CUDA_ARCH_LIST={_v(capability)}."
    )


def check_gpu_architecture(facts: MachineFacts) -> list[Finding]:
    """A GPU architecture torch has no code for (error) or only PTX for (warning).

    One finding per distinct compute capability; the subject lists its GPUs.
    """
    torch = facts.torch
    if torch is None or not torch.probed or not torch.arch_list or torch.cuda_version is None:
        return []
    by_capability: dict[Version, list[GpuSample]] = {}
    for s in facts.gpu.samples:
        if s.compute_capability is not None:
            by_capability.setdefault(s.compute_capability, []).append(s)
    out: list[Finding] = []
    for capability, samples in sorted(by_capability.items()):
        support = arch_support(torch.arch_list, capability)
        if support == "cubin":
            continue
        arch = f"sm_{capability[0]}{capability[1]}"
        evidence = {
            "gpus": [f"gpu{s.index}" for s in samples],
            "gpu_name": samples[0].name,
            "compute_capability": _v(capability),
            "gpu_arch": arch,
            "torch_version": torch.version,
            "torch_arch_list": list(torch.arch_list),
        }
        if support == "ptx":
            out.append(
                Finding(
                    id="driver.gpu_arch_ptx_only",
                    category=Category.DRIVER,
                    severity=Severity.WARNING,
                    title=(
                        f"torch has no compiled code for {samples[0].name} ({arch}); the "
                        "driver must JIT-compile every kernel from PTX, which takes minutes "
                        "at start-up and may run slower"
                    ),
                    evidence=evidence,
                    fix=_newer_torch_fix(capability, facts)
                    + " Until then, keep the compiled kernels between runs with "
                    "CUDA_CACHE_MAXSIZE=4294967296 (the default 256 MiB cache is too small "
                    "for torch).",
                    subject=_gpu_list(samples),
                )
            )
            continue
        targets = [c for c in (arch_capability(a) for a in torch.arch_list) if c is not None]
        too_old = bool(targets) and capability < min(targets)
        out.append(
            Finding(
                id="driver.gpu_arch_unsupported",
                category=Category.DRIVER,
                severity=Severity.ERROR,
                title=(
                    f"torch {torch.version} has no code for {samples[0].name} ({arch}): "
                    "CUDA kernels fail with 'no kernel image is available'"
                ),
                evidence=evidence,
                fix=_older_torch_fix(capability)
                if too_old
                else _newer_torch_fix(capability, facts),
                subject=_gpu_list(samples),
            )
        )
    return out


def check_cuda_runtime(facts: MachineFacts) -> list[Finding]:
    """A CUDA build of torch that cannot use the GPUs, or cannot load cuDNN."""
    torch = facts.torch
    if torch is None or not torch.probed or torch.cuda_version is None:
        return []
    if not facts.gpu.samples:
        return []
    if not torch.cuda_available:
        return [] if _major_mismatch(torch, facts) else [_cuda_unavailable(torch, facts)]
    if not torch.cudnn_available:
        return [
            Finding(
                id="driver.cudnn_unavailable",
                category=Category.DRIVER,
                severity=Severity.WARNING,
                title=(
                    "torch cannot load cuDNN: convolutions, RNNs and attention fall back "
                    "to slower kernels"
                ),
                evidence={
                    "torch_version": torch.version,
                    "torch_cuda_version": _v(torch.cuda_version),
                    "cudnn_version": torch.cudnn_version,
                    "LD_LIBRARY_PATH": facts.host.env.get("LD_LIBRARY_PATH"),
                },
                fix=(
                    "Reinstall torch so its own cuDNN comes with it (pip install "
                    "--force-reinstall torch, which pulls nvidia-cudnn-cu*), and make sure "
                    "LD_LIBRARY_PATH does not put an older system cuDNN first; "
                    "python -c 'import torch; print(torch.backends.cudnn.version())' "
                    "shows the error."
                ),
                subject="host",
            )
        ]
    return []


def _major_mismatch(torch: TorchBuild, facts: MachineFacts) -> bool:
    driver = facts.gpu.driver
    if driver is None or driver.cuda_version is None or torch.cuda_version is None:
        return False
    return torch.cuda_version[0] > driver.cuda_version[0]


# Values of CUDA_VISIBLE_DEVICES that hide every GPU from CUDA.
_HIDING_VALUES = ("", "-1", "none")


def _cuda_unavailable(torch: TorchBuild, facts: MachineFacts) -> Finding:
    visible = facts.host.env.get("CUDA_VISIBLE_DEVICES")
    hidden = visible is not None and visible.strip() in _HIDING_VALUES
    if hidden:
        fix = (
            f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU from CUDA: unset it, or set "
            "it to the GPUs to use (CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,1)."
        )
    else:
        fix = (
            "Run python -c 'import torch; torch.cuda.init()' to see CUDA's error; common "
            "causes are no permission on /dev/nvidia* (add the user to the video group), a "
            "container started without GPU access (docker run --gpus all), or "
            "CUDA_VISIBLE_DEVICES naming GPUs that do not exist."
        )
    return Finding(
        id="driver.torch_cuda_unavailable",
        category=Category.DRIVER,
        severity=Severity.ERROR,
        title=(
            f"torch {torch.version} is a CUDA build, but torch.cuda.is_available() is false "
            f"although the driver shows {len(facts.gpu.samples)} GPU(s)"
        ),
        evidence={
            "torch_version": torch.version,
            "torch_cuda_version": _v(torch.cuda_version) if torch.cuda_version else None,
            "gpu_count": len(facts.gpu.samples),
            "CUDA_VISIBLE_DEVICES": visible,
        },
        fix=fix,
        subject="host",
    )


CHECKS = (
    check_torch_installed,
    check_torch_cuda_build,
    check_gpu_architecture,
    check_cuda_runtime,
)
