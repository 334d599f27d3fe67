"""What the installed PyTorch was built for (read lazily: importing torch is slow).

:func:`read_torch_build` reads the version and CUDA version from the installed
files without importing torch (importing it costs about two seconds); only
when asked does it import torch for the facts that need the library loaded
(compiled GPU architectures, cuDNN, whether CUDA initialises).
:func:`torch_build_from_dict` reads the same facts from a simulation file.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainmedic.errors import SimulationFileError


@dataclass(frozen=True)
class TorchBuild:
    """Facts about the installed torch.

    Attributes:
        version: ``torch.__version__``, e.g. ``"2.4.0+cu124"``.
        cuda_version: CUDA toolkit torch was built with, ``(major, minor)``;
            ``None`` for a CPU-only build.
        arch_list: GPU architectures compiled in, e.g. ``("sm_80", "sm_90")``;
            ``sm_XY`` is a binary (cubin), ``compute_XY`` is PTX the driver can
            compile for newer GPUs. Empty when unknown (torch not imported).
        cudnn_version: cuDNN version as an integer (``90100``), ``None`` if absent.
        cudnn_available: whether cuDNN loads.
        cuda_available: ``torch.cuda.is_available()``.
        probed: whether torch was loaded to read ``arch_list``, the cuDNN
            fields and ``cuda_available``; when ``False`` those fields are
            unknown and keep their defaults, so checks must not judge them.
    """

    version: str
    cuda_version: tuple[int, int] | None
    arch_list: tuple[str, ...] = ()
    cudnn_version: int | None = None
    cudnn_available: bool = False
    cuda_available: bool = False
    probed: bool = False


def read_torch_build(import_torch: bool) -> TorchBuild | None:
    """The installed torch's build facts, or ``None`` when torch is not installed.

    Args:
        import_torch: also import torch to read the architecture list, cuDNN and
            CUDA availability. Worth it only on a machine with GPUs; any
            failure while doing so leaves those fields at their defaults.
    """
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    version_file = _version_file(spec.submodule_search_locations)
    assignments = _read_assignments(version_file) if version_file is not None else {}
    version = _distribution_version() or _as_str(assignments.get("__version__")) or "unknown"
    cuda_version = parse_cuda_version(_as_str(assignments.get("cuda")))
    build = TorchBuild(version=version, cuda_version=cuda_version)
    if not import_torch:
        return build
    return _probe(build)


def parse_cuda_version(text: str | None) -> tuple[int, int] | None:
    """``"12.4"`` -> ``(12, 4)``; ``None`` or anything unparsable -> ``None``."""
    if not text:
        return None
    parts = text.strip().split(".")
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return int(parts[0]), int(parts[1])


def _distribution_version() -> str | None:
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        # A source build on sys.path without package metadata.
        return None


def _version_file(locations: Any) -> Path | None:
    for location in locations or ():
        candidate = Path(location) / "version.py"
        if candidate.is_file():
            return candidate
    return None


def _read_assignments(path: Path) -> dict[str, Any]:
    """Top-level ``NAME = constant`` assignments of a Python file, without running it."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return {}
    found: dict[str, Any] = {}
    for node in tree.body:
        # torch writes both ``cuda = '12.4'`` and ``cuda: Optional[str] = '12.4'``.
        if isinstance(node, ast.Assign):
            targets = node.targets
            value = node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
            value = node.value
        else:
            continue
        if not isinstance(value, ast.Constant):
            continue
        for target in targets:
            if isinstance(target, ast.Name):
                found[target.id] = value.value
    return found


def _as_str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _probe(build: TorchBuild) -> TorchBuild:
    """Import torch and read what needs the library loaded; failures keep defaults."""
    try:
        import torch
    except Exception:
        # A broken install (missing shared library, ABI mismatch) must not stop
        # doctor; the version facts read from the files still stand.
        return build
    arch_list: tuple[str, ...] = ()
    cudnn_version: int | None = None
    cudnn_available = False
    cuda_available = False
    try:
        arch_list = tuple(str(a) for a in torch.cuda.get_arch_list())
    except Exception:
        arch_list = ()
    try:
        # torch.backends.cudnn's functions carry no annotations.
        cudnn: Any = torch.backends.cudnn
        raw = cudnn.version()
        cudnn_version = None if raw is None else int(raw)
        cudnn_available = bool(cudnn.is_available()) and cudnn_version is not None
    except Exception:
        # torch raises RuntimeError when the cuDNN it finds is incompatible.
        cudnn_version, cudnn_available = None, False
    try:
        cuda_available = bool(torch.cuda.is_available())
    except Exception:
        cuda_available = False
    return TorchBuild(
        version=build.version,
        cuda_version=build.cuda_version,
        arch_list=arch_list,
        cudnn_version=cudnn_version,
        cudnn_available=cudnn_available,
        cuda_available=cuda_available,
        probed=True,
    )


_RUNTIME_FIELDS = ("arch_list", "cudnn_version", "cudnn_available", "cuda_available")
_KNOWN_FIELDS = {"version", "cuda_version", *_RUNTIME_FIELDS}


def torch_build_from_dict(data: object, source: str) -> TorchBuild:
    """The ``torch`` section of a simulation file (docs/simulation-format.md).

    ``probed`` is true when the section gives any of ``arch_list``,
    ``cudnn_version``, ``cudnn_available`` or ``cuda_available``, as if torch
    had been imported; otherwise those facts count as unknown.

    Raises:
        SimulationFileError: naming ``source`` and the field (``torch.<field>``).
    """

    def fail(field: str | None, problem: str) -> SimulationFileError:
        return SimulationFileError(source, f"torch.{field}" if field else "torch", problem)

    if not isinstance(data, Mapping):
        raise fail(None, "expected an object")
    unknown = sorted(set(data) - _KNOWN_FIELDS)
    if unknown:
        raise fail(unknown[0], "unknown field")
    version = data.get("version")
    if not isinstance(version, str) or not version:
        raise fail("version", 'missing or not a string (e.g. "2.4.0+cu124")')
    raw_cuda = data.get("cuda_version")
    cuda_version: tuple[int, int] | None = None
    if raw_cuda is not None:
        cuda_version = parse_cuda_version(raw_cuda) if isinstance(raw_cuda, str) else None
        if cuda_version is None:
            raise fail("cuda_version", f'expected "MAJOR.MINOR" or null, got {raw_cuda!r}')
    raw_arch = data.get("arch_list", [])
    if not isinstance(raw_arch, list) or not all(
        isinstance(a, str) and _is_arch(a) for a in raw_arch
    ):
        raise fail("arch_list", 'expected a list such as ["sm_80", "sm_90", "compute_90"]')
    raw_cudnn = data.get("cudnn_version")
    if raw_cudnn is not None and (
        not isinstance(raw_cudnn, int) or isinstance(raw_cudnn, bool) or raw_cudnn <= 0
    ):
        raise fail(
            "cudnn_version", f"expected a positive integer (e.g. 90100) or null, got {raw_cudnn!r}"
        )
    flags: dict[str, bool] = {}
    for key in ("cudnn_available", "cuda_available"):
        value = data.get(key, False)
        if not isinstance(value, bool):
            raise fail(key, f"expected true or false, got {value!r}")
        flags[key] = value
    return TorchBuild(
        version=version,
        cuda_version=cuda_version,
        arch_list=tuple(raw_arch),
        cudnn_version=raw_cudnn,
        cudnn_available=flags["cudnn_available"],
        cuda_available=flags["cuda_available"],
        probed=any(key in data for key in _RUNTIME_FIELDS),
    )


def _is_arch(name: str) -> bool:
    """``sm_80``, ``sm_90a``, ``compute_90``, ``sm_100f``: prefix, digits, optional suffix."""
    prefix, _, rest = name.partition("_")
    if prefix not in ("sm", "compute"):
        return False
    digits = rest.rstrip("af")
    return digits.isdigit() and len(rest) - len(digits) <= 1


def arch_capability(name: str) -> tuple[int, int] | None:
    """Compute capability an architecture name targets: ``sm_86`` -> ``(8, 6)``.

    The last digit is the minor version (``sm_120`` -> ``(12, 0)``); an ``a``
    or ``f`` suffix is ignored here. ``None`` for anything else.
    """
    if not _is_arch(name):
        return None
    digits = name.partition("_")[2].rstrip("af")
    if len(digits) < 2:
        return None
    return int(digits[:-1]), int(digits[-1])


def arch_support(arch_list: tuple[str, ...], capability: tuple[int, int]) -> str | None:
    """How a GPU of ``capability`` can run code built for ``arch_list``.

    Returns ``"cubin"`` when a compiled binary runs on it, ``"ptx"`` when only
    PTX can be JIT-compiled for it by the driver, ``None`` when nothing runs.

    The CUDA compatibility rules applied (CUDA C++ Programming Guide,
    "Binary Compatibility" and "PTX Compatibility"):

    - a cubin ``sm_XY`` runs on compute capability ``X.Z`` for any ``Z >= Y``:
      same major only (``sm_80`` runs on 8.6 and 8.9, not on 9.0);
    - PTX ``compute_XY`` JIT-compiles for any capability ``>= X.Y``, any major;
    - arch-specific targets (``sm_90a``, ``compute_90a``) run only on exactly
      ``X.Y``; family targets (``sm_100f``) on the same major with minor ``>= Y``.
    """
    best: str | None = None
    for name in arch_list:
        target = arch_capability(name)
        if target is None:
            continue
        suffix = name[-1] if name[-1] in "af" else ""
        if suffix == "a":
            runs = capability == target
        elif suffix == "f" or name.startswith("sm_"):
            runs = capability[0] == target[0] and capability[1] >= target[1]
        else:
            runs = capability >= target
        if not runs:
            continue
        if name.startswith("sm_"):
            return "cubin"
        best = "ptx"
    return best
