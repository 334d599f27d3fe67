"""Tests marked ``gpu`` need a real NVIDIA GPU and a CUDA build of torch.

Without them they skip, saying why; ``scripts/gpu-check`` sets
``TRAINMEDIC_REQUIRE_GPU=1`` so that on a GPU machine a missing GPU fails
instead (a GPU check that silently skips proves nothing).
"""

from __future__ import annotations

import functools
import os

import pytest

REQUIRE_ENV = "TRAINMEDIC_REQUIRE_GPU"


@functools.cache
def missing_gpu() -> str | None:
    """Why GPU tests cannot run here, or ``None`` when they can."""
    from trainmedic.gpu.nvml import open_nvml

    backend = open_nvml()
    try:
        if backend.kind != "nvml":
            return f"no NVIDIA GPU: {backend.absent_reason}"
        if backend.device_count() == 0:
            return "the NVIDIA driver reports no GPU"
    finally:
        backend.close()
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if torch.version.cuda is None:
        return f"torch {torch.__version__} is a CPU-only build"
    if not torch.cuda.is_available():
        return "torch cannot use the GPU (torch.cuda.is_available() is False)"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is None:
        return
    reason = missing_gpu()
    if reason is None:
        return
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"{REQUIRE_ENV} is set but {reason}", pytrace=False)
    pytest.skip(reason)
