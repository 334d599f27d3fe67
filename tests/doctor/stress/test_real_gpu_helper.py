"""The shared NVML fixture of the gpu-marked tests: no driver skips, or fails where
scripts/gpu-check requires a GPU; the backend is closed either way."""

from __future__ import annotations

import pytest

import support.real_gpu as real_gpu
from trainmedic.gpu.backend import NoGpuBackend


class Closing(NoGpuBackend):
    closed = False

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("required", [False, True])
def test_no_driver_skips_or_fails_and_closes(
    monkeypatch: pytest.MonkeyPatch, required: bool
) -> None:
    opened = Closing("no NVIDIA driver: libnvidia-ml.so was not found")
    monkeypatch.setattr(real_gpu, "open_nvml", lambda: opened)
    if required:
        monkeypatch.setenv(real_gpu.REQUIRE_ENV, "1")
    else:
        monkeypatch.delenv(real_gpu.REQUIRE_ENV, raising=False)
    outcome = pytest.fail.Exception if required else pytest.skip.Exception
    with pytest.raises(outcome, match="no NVML here: no NVIDIA driver"):
        next(real_gpu.open_real_nvml())
    assert opened.closed
