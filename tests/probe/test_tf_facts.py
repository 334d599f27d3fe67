"""The probe's reading of TensorFlow's GPU settings and pool (trainmedic.probe.tf_facts),
against a stand-in for TensorFlow's config API: the same calls a GPU build answers."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from trainmedic.probe.tf_facts import GROWTH_ENV, dtype_policy, read


class FakeConfig:
    def __init__(self, gpus: int, growth: list[bool], peak: list[int], broken: bool = False):
        self.devices = [SimpleNamespace(name=f"/physical_device:GPU:{i}") for i in range(gpus)]
        self.growth = growth
        self.peak = peak
        self.broken = broken
        self.experimental = SimpleNamespace(get_memory_growth=self._growth,
                                            get_memory_info=self._info)  # fmt: skip
        self.optimizer = SimpleNamespace(get_jit=lambda: "autoclustering")

    def list_physical_devices(self, kind: str) -> list[Any]:
        assert kind == "GPU"
        return self.devices

    def _growth(self, device: Any) -> bool:
        return self.growth[self.devices.index(device)]

    def _info(self, name: str) -> dict[str, int]:
        if self.broken:
            raise RuntimeError("not initialised")
        i = int(name.split(":")[1])
        return {"current": self.peak[i] // 2, "peak": self.peak[i]}


def _keras(policy: str) -> Any:
    policy_object = SimpleNamespace(name=policy)
    return SimpleNamespace(config=SimpleNamespace(dtype_policy=lambda: policy_object))


def test_each_gpus_growth_and_pool_with_the_policy_and_xla(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GROWTH_ENV, raising=False)
    tf = SimpleNamespace(config=FakeConfig(2, [False, True], [3 << 30, 5 << 30]))
    facts = read(tf, {"keras": _keras("mixed_bfloat16")}, jit_compile=True)
    assert facts is not None
    assert facts["gpus"] == [
        {"index": 0, "name": "/physical_device:GPU:0", "memory_growth": False,
         "in_use_bytes": 3 << 29, "peak_bytes": 3 << 30},
        {"index": 1, "name": "/physical_device:GPU:1", "memory_growth": True,
         "in_use_bytes": 5 << 29, "peak_bytes": 5 << 30},
    ]  # fmt: skip
    assert (facts["dtype_policy"], facts["jit_compile"], facts["auto_jit"]) == (
        "mixed_bfloat16", True, "autoclustering")  # fmt: skip
    assert facts["growth_env"] is False
    monkeypatch.setenv(GROWTH_ENV, "TRUE")
    assert read(tf, {}, None)["growth_env"] is True  # type: ignore[index]


def test_no_gpu_is_none_and_a_failing_call_leaves_out_only_its_figure() -> None:
    assert read(SimpleNamespace(config=FakeConfig(0, [], [])), {}, None) is None
    tf = SimpleNamespace(config=FakeConfig(1, [False], [1], broken=True))
    facts = read(tf, {}, None)
    assert facts is not None and facts["gpus"] == [
        {"index": 0, "name": "/physical_device:GPU:0", "memory_growth": False}]  # fmt: skip
    assert read(SimpleNamespace(config=None), {}, None) is None  # no config API at all


def test_the_policy_from_keras_3_or_keras_2() -> None:
    tf_keras = SimpleNamespace(mixed_precision=SimpleNamespace(
        global_policy=lambda: SimpleNamespace(name="mixed_float16")))  # fmt: skip
    assert dtype_policy({"tf_keras": tf_keras}) == "mixed_float16"
    assert dtype_policy({"keras": _keras("float32"), "tf_keras": tf_keras}) == "float32"
    assert dtype_policy({}) is None
