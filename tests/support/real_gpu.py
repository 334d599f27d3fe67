"""The NVML backend of the real GPU that ``gpu``-marked tests read, shared by them.

The marker's skip (tests/conftest.py) decides before a test runs whether a real GPU
is there; :func:`nvml_backend_fixture` opens NVML once per module and, should it still
find no driver, skips the same way (or fails under ``TRAINMEDIC_REQUIRE_GPU=1``, as
scripts/gpu-check sets, since a GPU check that silently skips proves nothing).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

from trainmedic.gpu.backend import GpuBackend
from trainmedic.gpu.nvml import open_nvml

REQUIRE_ENV = "TRAINMEDIC_REQUIRE_GPU"


def no_gpu(reason: str) -> None:
    """Skip the test for ``reason``; fail it instead where a GPU is required."""
    if os.environ.get(REQUIRE_ENV):
        pytest.fail(f"{REQUIRE_ENV} is set but {reason}", pytrace=False)
    pytest.skip(reason)


def open_real_nvml() -> Iterator[GpuBackend]:
    """NVML on this machine's GPUs, closed afterwards (a generator for a fixture)."""
    opened = open_nvml()
    try:
        if opened.kind != "nvml":
            no_gpu(f"no NVML here: {opened.absent_reason}")
        elif opened.device_count() == 0:
            no_gpu("the NVIDIA driver reports no GPU")
        yield opened
    finally:
        opened.close()


def nvml_backend_fixture() -> Callable[[], Iterator[GpuBackend]]:
    """A module-scoped ``backend`` fixture: ``backend = nvml_backend_fixture()``."""

    @pytest.fixture(scope="module")
    def backend() -> Iterator[GpuBackend]:
        yield from open_real_nvml()

    return backend
