"""The cause of a wait for a tf.data pipeline, from the stages the probe described:
Python first (from_generator, py_function), then a serial map, files read one after
another, no prefetch, and a pipeline already parallel that is still too slow."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from support.builders import (
    make_event,
    make_host_series,
    make_loader,
    make_record,
    make_steps,
)
from trainmedic.diagnose import diagnose_run
from trainmedic.diagnose.input_bound import input_bound
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category
from trainmedic.record.types import RunRecord

TH = Thresholds()


def _stages(*ops: str, **flags: Any) -> dict[str, Any]:
    """A described pipeline, tail first, as the probe sends it."""
    stages = [{"op": op} for op in ops]
    data: dict[str, Any] = {
        "stages": stages,
        "serial_maps": sum(1 for op in ops if op == "Map"),
        "python_stages": 0,
        "generator": False,
        "file_sources": 0,
        "parallel_reads": "ParallelInterleave" in ops,
        "prefetch": "Prefetch" in ops[: ops.index("Batch") if "Batch" in ops else len(ops)],
        "cache": "Cache" in ops,
        "batch_size": 32,
        "loader_id": 1,
        "summary": " > ".join(reversed(ops)),
    }
    data.update(flags)
    return data


def _record(pipeline: dict[str, Any] | None, wait: float = 0.15) -> RunRecord:
    loader = dataclasses.replace(
        make_loader(0, batch_size=32, pin_memory=False, prefetch_factor=None, dataset_len=None),
        dataset_type="tf.data",
    )
    events = [make_event("tfdata_pipeline", **pipeline)] if pipeline is not None else []
    return make_record(make_steps(200, 0.25, wait), host=make_host_series(55),
                       loaders=[loader], events=events)  # fmt: skip


@pytest.mark.parametrize(
    ("pipeline", "key", "category", "says"),
    [
        (_stages("Batch", "FlatMap", "Tensor", generator=True), "gil",
         Category.FRAMEWORK_CONFIG, "from_generator"),
        (_stages("Prefetch", "Batch", "ParallelMap", "TensorSlice", python_stages=1), "gil",
         Category.FRAMEWORK_CONFIG, "tf.py_function"),
        (_stages("Batch", "Map", "TensorSlice"), "workers", Category.FRAMEWORK_CONFIG,
         "num_parallel_calls=tf.data.AUTOTUNE"),
        (_stages("Prefetch", "Batch", "ParallelMap", "TFRecord", "TensorSlice", file_sources=1),
         "io", Category.IO, "interleave("),
        (_stages("Batch", "ParallelMap", "TensorSlice"), "workers", Category.FRAMEWORK_CONFIG,
         ".prefetch(tf.data.AUTOTUNE)"),
        (_stages("Prefetch", "Batch", "ParallelMap", "TensorSlice"), "cpu", Category.CPU,
         "cheaper"),
    ],
    ids=["generator", "py-function", "serial-map", "serial-files", "no-prefetch", "parallel"],
)
def test_the_first_thing_the_pipeline_shows_is_the_cause(
    pipeline: dict[str, Any], key: str, category: Category, says: str
) -> None:
    (f,) = input_bound(RunView.of(_record(pipeline)), TH)
    assert (f.id, f.category) == (f"input.{key}", category)
    assert says in f.title + f.fix
    # tf.data's words only: no DataLoader setting, nothing for --apply-from to set.
    assert "DataLoader" not in f.fix + f.title and "num_workers" not in f.fix
    assert f.apply is None
    assert f.evidence["tfdata_pipeline"] == pipeline["summary"]
    assert f.evidence["data_wait_share"] == pytest.approx(0.6)


def test_a_pipeline_not_described_still_gets_tf_datas_words() -> None:
    (f,) = input_bound(RunView.of(_record(None)), TH)
    assert f.evidence["tfdata_pipeline"] == "not described"
    assert "DataLoader" not in f.fix


def test_a_pipeline_that_keeps_up_is_no_finding() -> None:
    found = diagnose_run(_record(_stages("Batch", "Map", "TensorSlice"), wait=0.005))
    assert not [f for f in found if f.id.startswith("input.")]
