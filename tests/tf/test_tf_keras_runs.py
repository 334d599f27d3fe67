"""Keras 2 (``tf_keras``) jobs under ``trainmedic run``, unmodified
(``tests/tf/scripts/train_tf_keras.py``): fit's steps, phases and its wait for a tf.data
pipeline; custom loops with Keras 2's optimizers and its legacy ones."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from tests.tf.installed import needs
from tests.tf.test_keras_runs import _input, _run

pytestmark = needs("tensorflow", "tf_keras")

SCRIPT = Path(__file__).resolve().parent / "scripts" / "train_tf_keras.py"


def test_fit_has_its_steps_phases_and_the_cause_of_its_wait(tmp_path: Path) -> None:
    r = _run(tmp_path, "fit", "--steps", "40", "--epochs", "2", script=SCRIPT)
    assert r["rc"] == 0 and "done" in r["output"]
    phases = Counter(s.get("ph", "train") for s in r["steps"])
    assert phases == {"train": 80, "eval": 2, "checkpoint": 2}, phases
    assert (tmp_path / "model.h5").is_file()
    (f,) = _input(r["findings"])
    assert f["id"] == "input.workers" and "num_parallel_calls=tf.data.AUTOTUNE" in f["fix"]
    assert f["evidence"]["tfdata_pipeline"] == "TensorSlice > Map > Batch(32)"
    assert not [e for e in r["events"] if e["kind"] in ("probe_error", "probe_degraded")]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["custom", "legacy"])
def test_custom_loops_with_keras_2_optimizers(tmp_path: Path, mode: str) -> None:
    r = _run(tmp_path, mode, "--steps", "50", script=SCRIPT)
    assert r["rc"] == 0 and "done" in r["output"]
    train = [s for s in r["steps"] if s.get("ph", "train") == "train"]
    # One step per apply_gradients, with the model's call, the tape's gradient and the
    # optimizer as compute and the iterator's wait measured; the loss (not a layer in
    # Keras 2) and the loop's own Python are the rest.
    assert len(train) == 50 and all(s.get("src", "optimizer") == "optimizer" for s in train)
    steady = train[5:]
    assert all(s.get("c", 0.0) > 0 for s in steady)
    assert sum(s.get("w", 0.0) + s.get("c", 0.0) for s in steady) / sum(
        s["d"] for s in steady
    ) > 0.7
