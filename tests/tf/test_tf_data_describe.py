"""The probe's reading of real tf.data pipelines: the stages and settings that decide
their speed (trainmedic.probe.tf_data). TensorFlow runs in a child process: the test
process keeps torch alone."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from tests.tf.installed import needs

pytestmark = needs("tensorflow")

PIPELINES = r'''
import json, os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
from trainmedic.probe.tf_data import describe, summary

def gen():
    yield [1.0, 2.0]

s = lambda: tf.data.Dataset.from_tensor_slices(tf.zeros([64, 4]))
files = tf.data.Dataset.from_tensor_slices(["a.tfr", "b.tfr"])
built = {
    "serial": s().map(lambda x: x * 2).batch(8),
    "parallel": s().map(lambda x: x, num_parallel_calls=tf.data.AUTOTUNE).cache().batch(4)
        .prefetch(tf.data.AUTOTUNE),
    "prefetch-before-batch": s().prefetch(2).batch(4),
    "py-function": s().map(lambda x: tf.py_function(lambda v: v, [x], tf.float32),
                           num_parallel_calls=4),
    "generator": tf.data.Dataset.from_generator(
        gen, output_signature=tf.TensorSpec((2,), tf.float32)).batch(2),
    "serial-files": tf.data.TFRecordDataset(["a.tfr", "b.tfr"]).batch(2),
    "interleaved": files.interleave(tf.data.TFRecordDataset, num_parallel_calls=2),
}
print(json.dumps({k: {**describe(v), "line": summary(describe(v))} for k, v in built.items()}))
'''


@pytest.fixture(scope="module")
def described() -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", PIPELINES], capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_serial_map_without_prefetch(described: dict[str, Any]) -> None:
    d = described["serial"]
    assert [s["op"] for s in d["stages"]] == ["Batch", "Map", "TensorSlice"]
    assert (d["serial_maps"], d["prefetch"], d["cache"], d["batch_size"]) == (1, False, False, 8)
    assert d["line"] == "TensorSlice > Map > Batch(8)"


def test_a_parallel_cached_prefetched_pipeline(described: dict[str, Any]) -> None:
    d = described["parallel"]
    assert (d["serial_maps"], d["prefetch"], d["cache"]) == (0, True, True)
    assert d["stages"][-2] == {"op": "ParallelMap", "parallel": -1}
    assert d["line"] == "TensorSlice > ParallelMap(parallel=AUTOTUNE) > Cache > Batch(4) > Prefetch"
    # A prefetch before the batch overlaps nothing with the step.
    assert described["prefetch-before-batch"]["prefetch"] is False


def test_python_in_a_stage_and_a_generator_are_seen_in_their_functions(
    described: dict[str, Any],
) -> None:
    py = described["py-function"]
    assert py["python_stages"] == 1 and py["stages"][0]["python"] is True
    g = described["generator"]
    assert g["generator"] is True and "[generator]" in g["line"]


def test_files_read_in_series_and_in_parallel(described: dict[str, Any]) -> None:
    serial = described["serial-files"]
    assert (serial["file_sources"], serial["parallel_reads"]) == (1, False)
    assert described["interleaved"]["parallel_reads"] is True
