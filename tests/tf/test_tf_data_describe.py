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

def triple(x):
    return x * 3

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
    "augmented": s().map(triple, num_parallel_calls=2).map(lambda x: x * 2)
        .map(lambda x: x + tf.random.uniform([4])).repeat().batch(4).prefetch(1),
    "shuffled-first": s().shuffle(8).map(lambda x: x * 3).batch(4),
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
    assert d["stages"][-2] == {"op": "ParallelMap", "parallel": -1, "fn": "<lambda>"}
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


def test_repeats_random_stages_and_where_a_cache_goes(described: dict[str, Any]) -> None:
    a = described["augmented"]
    # Range of work: the two deterministic maps; the random one after them ends it.
    assert (a["repeat"], a["random_stages"]) == (-1, 1)
    assert a["cache_after"] == ".map(<lambda>) (map 2 from the source)"
    assert a["stages"][-2]["fn"] == "triple"
    assert [s["op"] for s in a["stages"] if s.get("random")] == ["Map"]
    # A shuffle at the source leaves no place that keeps every epoch's data as made.
    assert described["shuffled-first"]["cache_after"] is None
    # A pipeline with its cache has none to add; one with no work has no place.
    assert described["parallel"]["cache_after"] is None
    serial = described["serial"]
    assert (serial["repeat"], serial["cache_after"]) == (1, ".map(<lambda>)")
