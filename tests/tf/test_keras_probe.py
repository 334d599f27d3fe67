"""The Keras part of the probe in a process of its own, without a supervisor: what it
hooks, what it says when Keras lacks a class it hooks (``probe_degraded``, and the
rest still measured), and that a Keras job on another backend never loads TensorFlow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from tests.tf.installed import installed, needs

pytestmark = needs("tensorflow", "keras")

CHILD = r'''
import json, os, sys
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
from trainmedic.probe.env import ProbeConfig
from trainmedic.probe.runtime import Probe
from trainmedic.probe.segments import StepDraft
from trainmedic.probe import keras_hooks

probe = Probe(ProbeConfig("unix:/nonexistent", "t", None, frozenset(), frozenset()))
probe._ensure_agent = lambda: None  # no supervisor: the outbox keeps what would be sent
import keras
if sys.argv[1] == "no-backup":
    import keras.src.callbacks as cbs
    del cbs.BackupAndRestore  # a Keras where the probe does not find it
keras_hooks.install(keras, probe)
out = {"tensorflow_loaded": "tensorflow" in sys.modules, "backend": keras.config.backend()}
if sys.argv[1] != "torch-backend":
    import numpy as np
    import tensorflow as tf
    keras_hooks.install_tensorflow(tf, probe)
    x = np.zeros((96, 4), "float32"); y = np.zeros((96,), "int32")
    m = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    m.compile("sgd", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    if sys.argv[1] == "gpu-facts":  # TensorFlow's answers on a GPU, stood in for
        import trainmedic.probe.tf_facts as tf_facts
        tf_facts.read = lambda tf, modules, jit: {
            "gpus": [{"index": 0, "memory_growth": False, "peak_bytes": 1 << 30}],
            "growth_env": False, "dtype_policy": "float32", "jit_compile": jit,
            "auto_jit": None}
    epochs = 8 if sys.argv[1] == "gpu-facts" else 2
    m.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(32), epochs=epochs, verbose=0)
    probe.tracker.finish(probe.clock())
drafts = [m for m in probe.outbox if isinstance(m, StepDraft)]
events = [m for m in probe.outbox if type(m).__name__ == "RunEvent"]
out["steps"] = [(d.phase, d.source) for d in drafts]
out["waited"] = sum(1 for d in drafts if d.segment.fetches)
out["events"] = [(e.kind, e.message, e.data) for e in events]
out["part_error"] = probe.parts["keras"].error
print(json.dumps(out))
'''


def _child(mode: str, **env: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True,
                          timeout=120, check=False, env={**os.environ, **env})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_fit_gives_a_step_per_batch_each_with_its_wait_for_data() -> None:
    r = _child("full")
    assert r["part_error"] is None
    assert r["steps"] == [["train", "api"]] * 6  # 3 batches x 2 epochs
    # Every step took a batch; a prefetch TensorFlow puts after the tail may hand one over
    # before the step asks (its wait is then nothing).
    assert r["waited"] == 6
    (pipeline,) = [e for e in r["events"] if e[0] == "tfdata_pipeline"]
    assert pipeline[2]["summary"] == "TensorSlice > Batch(32)"
    assert not [e for e in r["events"] if e[0] == "probe_degraded"]
    # A second epoch is said once; TensorFlow sees no GPU here: no GPU facts.
    assert [e[2]["how"] for e in r["events"] if e[0] == "tfdata_epochs"] == ["fit's epoch 2"]
    assert not [e for e in r["events"] if e[0] == "tf_gpu"]


def test_gpu_settings_are_sent_after_the_warm_up_with_the_models_jit_compile() -> None:
    r = _child("gpu-facts")
    assert len(r["steps"]) == 24
    (facts,) = [e for e in r["events"] if e[0] == "tf_gpu"]  # at step 20, not before or again
    assert facts[2]["dtype_policy"] == "float32" and facts[2]["jit_compile"] in (True, False)
    assert "pool peak 1.00 GiB" in facts[1]


def test_a_class_keras_lacks_is_named_and_the_rest_still_measured() -> None:
    r = _child("no-backup")
    (degraded,) = [e for e in r["events"] if e[0] == "probe_degraded"]
    _, message, data = degraded
    assert "keras.src.callbacks.BackupAndRestore" in message
    assert data["framework"] == "keras" and data["lost"] == [
        "BackupAndRestore's saves as a phase"
    ]
    assert len(r["steps"]) == 6 and r["part_error"] is None


def test_keras_on_another_backend_never_loads_tensorflow() -> None:
    if not installed("torch"):
        pytest.skip("torch is not installed")
    r = _child("torch-backend", KERAS_BACKEND="torch")
    assert r["backend"] == "torch"
    assert r["tensorflow_loaded"] is False
    assert r["part_error"] is None
