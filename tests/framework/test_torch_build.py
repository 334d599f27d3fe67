"""Reading the torch build: cheaply from files, fully by importing, or from a simulation."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path
from typing import Any

import pytest

from trainmedic.errors import SimulationFileError
from trainmedic.framework.torch_build import (
    TorchBuild,
    arch_capability,
    arch_support,
    parse_cuda_version,
    read_torch_build,
    torch_build_from_dict,
)

# A stand-in torch package: importing it fails unless the test allows it, so
# the cheap path is proven not to import torch.
FAKE_TORCH_INIT = """
import os
if os.environ.get("FAKE_TORCH_IMPORTABLE") != "1":
    raise RuntimeError("fake torch was imported")

class _Cuda:
    @staticmethod
    def get_arch_list():
        return ["sm_80", "sm_90", "compute_90"]

    @staticmethod
    def is_available():
        return os.environ.get("FAKE_TORCH_CUDA") == "1"

class _Cudnn:
    @staticmethod
    def version():
        if os.environ.get("FAKE_TORCH_CUDNN") == "broken":
            raise RuntimeError("cuDNN version incompatibility")
        return 90100

    @staticmethod
    def is_available():
        return True

class _Backends:
    cudnn = _Cudnn()

cuda = _Cuda()
backends = _Backends()
"""


def install_fake_torch(
    root: Path, monkeypatch: pytest.MonkeyPatch, version_py: str, dist_version: str | None
) -> None:
    package = root / "torch"
    package.mkdir()
    (package / "__init__.py").write_text(FAKE_TORCH_INIT)
    (package / "version.py").write_text(version_py)
    if dist_version is not None:
        dist = root / f"torch-{dist_version}.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: torch\nVersion: {dist_version}\n"
        )
    for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(
        sys, "path", [str(root)] + [p for p in sys.path if "site-packages" not in p]
    )
    importlib.invalidate_caches()


CU124_VERSION_PY = """from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']
__version__ = '2.4.0+cu124'
debug = False
cuda: Optional[str] = '12.4'
git_version = 'abc'
hip: Optional[str] = None
"""


def test_cheap_read_parses_version_file_without_importing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_fake_torch(tmp_path, monkeypatch, CU124_VERSION_PY, "2.4.0+cu124")
    build = read_torch_build(import_torch=False)
    assert build == TorchBuild(version="2.4.0+cu124", cuda_version=(12, 4))
    assert build.probed is False
    assert "torch" not in sys.modules


def test_plain_assignment_and_missing_metadata(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Older torch writes ``cuda = '11.8'``; a source build may lack dist-info.
    install_fake_torch(tmp_path, monkeypatch, "__version__ = '2.0.1'\ncuda = '11.8'\n", None)
    build = read_torch_build(import_torch=False)
    assert build == TorchBuild(version="2.0.1", cuda_version=(11, 8))


def test_cpu_build_has_no_cuda_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_torch(
        tmp_path, monkeypatch, "__version__ = '2.4.0+cpu'\ncuda = None\n", "2.4.0+cpu"
    )
    build = read_torch_build(import_torch=False)
    assert build is not None and build.cuda_version is None


def test_import_reads_arch_list_cudnn_and_cuda(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_fake_torch(tmp_path, monkeypatch, CU124_VERSION_PY, "2.4.0+cu124")
    monkeypatch.setenv("FAKE_TORCH_IMPORTABLE", "1")
    monkeypatch.setenv("FAKE_TORCH_CUDA", "1")
    build = read_torch_build(import_torch=True)
    assert build == TorchBuild(
        version="2.4.0+cu124",
        cuda_version=(12, 4),
        arch_list=("sm_80", "sm_90", "compute_90"),
        cudnn_version=90100,
        cudnn_available=True,
        cuda_available=True,
        probed=True,
    )


def test_import_failures_keep_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_torch(tmp_path, monkeypatch, CU124_VERSION_PY, "2.4.0+cu124")
    monkeypatch.setenv("FAKE_TORCH_IMPORTABLE", "1")
    monkeypatch.setenv("FAKE_TORCH_CUDNN", "broken")
    build = read_torch_build(import_torch=True)
    assert build is not None
    assert (build.cudnn_version, build.cudnn_available, build.cuda_available) == (
        None,
        False,
        False,
    )
    assert build.arch_list == ("sm_80", "sm_90", "compute_90")


def test_torch_that_fails_to_import_still_gives_file_facts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_fake_torch(tmp_path, monkeypatch, CU124_VERSION_PY, "2.4.0+cu124")
    build = read_torch_build(import_torch=True)  # the fake raises on import
    assert build == TorchBuild(version="2.4.0+cu124", cuda_version=(12, 4))


def test_torch_not_installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "torch" or m.startswith("torch.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    importlib.invalidate_caches()
    assert read_torch_build(import_torch=True) is None


def test_installed_torch_version_comes_from_package_metadata() -> None:
    build = read_torch_build(import_torch=False)
    assert build is not None
    assert build.version == importlib.metadata.version("torch")
    assert build.probed is False


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("12.4", (12, 4)),
        ("11.8.89", (11, 8)),
        ("12", None),
        ("", None),
        (None, None),
        ("x.y", None),
    ],
)
def test_parse_cuda_version(text: str | None, expected: tuple[int, int] | None) -> None:
    assert parse_cuda_version(text) == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("sm_86", (8, 6)),
        ("sm_120", (12, 0)),
        ("compute_90", (9, 0)),
        ("sm_90a", (9, 0)),
        ("sm_100f", (10, 0)),
        ("sm_8", None),
        ("gfx90a", None),
        ("sm_", None),
    ],
)
def test_arch_capability(name: str, expected: tuple[int, int] | None) -> None:
    assert arch_capability(name) == expected


@pytest.mark.parametrize(
    ("arch_list", "capability", "expected"),
    [
        (("sm_80",), (8, 0), "cubin"),
        (("sm_80",), (8, 6), "cubin"),
        (("sm_86",), (8, 0), None),
        (("sm_80",), (9, 0), None),
        (("sm_80", "compute_80"), (9, 0), "ptx"),
        (("compute_90",), (8, 9), None),
        (("sm_90a",), (9, 0), "cubin"),
        (("compute_90a",), (10, 0), None),
        (("sm_100f",), (10, 3), "cubin"),
        (("sm_100f",), (12, 0), None),
        ((), (9, 0), None),
    ],
)
def test_arch_support_rules(
    arch_list: tuple[str, ...], capability: tuple[int, int], expected: str | None
) -> None:
    assert arch_support(arch_list, capability) == expected


FULL_SECTION: dict[str, Any] = {
    "version": "2.4.0+cu124",
    "cuda_version": "12.4",
    "arch_list": ["sm_80", "sm_90"],
    "cudnn_version": 90100,
    "cudnn_available": True,
    "cuda_available": True,
}


def test_simulated_section_parses() -> None:
    assert torch_build_from_dict(FULL_SECTION, "f.json") == TorchBuild(
        version="2.4.0+cu124",
        cuda_version=(12, 4),
        arch_list=("sm_80", "sm_90"),
        cudnn_version=90100,
        cudnn_available=True,
        cuda_available=True,
        probed=True,
    )


def test_simulated_section_without_runtime_fields_is_not_probed() -> None:
    build = torch_build_from_dict({"version": "2.4.0+cpu", "cuda_version": None}, "f.json")
    assert build == TorchBuild(version="2.4.0+cpu", cuda_version=None, probed=False)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"version": 2.4}, "torch.version"),
        ({"version": ""}, "torch.version"),
        ({"cuda_version": "twelve"}, "torch.cuda_version"),
        ({"cuda_version": 12.4}, "torch.cuda_version"),
        ({"arch_list": "sm_80"}, "torch.arch_list"),
        ({"arch_list": ["sm_80", "ampere"]}, "torch.arch_list"),
        ({"cudnn_version": "9.1"}, "torch.cudnn_version"),
        ({"cudnn_version": True}, "torch.cudnn_version"),
        ({"cudnn_available": "yes"}, "torch.cudnn_available"),
        ({"cuda_available": 1}, "torch.cuda_available"),
        ({"cuda": "12.4"}, "torch.cuda"),
    ],
)
def test_malformed_section_names_file_and_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(SimulationFileError) as info:
        torch_build_from_dict({**FULL_SECTION, **change}, "sims/bad.json")
    assert info.value.field == field
    assert info.value.path == "sims/bad.json"
    assert str(info.value).startswith(f"simulation file sims/bad.json: {field}: ")


def test_missing_version_and_wrong_type() -> None:
    with pytest.raises(SimulationFileError, match=r"torch\.version"):
        torch_build_from_dict({"cuda_version": "12.4"}, "f.json")
    with pytest.raises(SimulationFileError, match="torch: expected an object"):
        torch_build_from_dict(["2.4.0"], "f.json")
