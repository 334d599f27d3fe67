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


def _record(
    pipeline: dict[str, Any] | None, wait: float = 0.15, epochs: bool = False
) -> RunRecord:
    loader = dataclasses.replace(
        make_loader(0, batch_size=32, pin_memory=False, prefetch_factor=None, dataset_len=None),
        dataset_type="tf.data",
    )
    events = [make_event("tfdata_pipeline", **pipeline)] if pipeline is not None else []
    if epochs:
        events.append(make_event("tfdata_epochs", how="fit's epoch 2"))
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


@pytest.mark.parametrize(
    ("pipeline", "epochs", "key", "where"),
    [
        # A second epoch seen by the probe; the cache goes after the map.
        (_stages("Prefetch", "Batch", "ParallelMap", "TensorSlice", cache_after=".map(decode)"),
         True, "cpu", "after .map(decode)"),
        # The pipeline repeats itself; the files' reads are what the cache saves.
        (_stages("Prefetch", "Batch", "Repeat", "ParallelInterleave", "TensorSlice",
                 file_sources=1, repeat=-1, cache_after=".interleave(read)"),
         False, "io", "after .interleave(read)"),
    ],
    ids=["second-epoch", "repeat-files"],
)
def test_work_redone_every_epoch_without_a_cache_is_named_with_where_to_cache(
    pipeline: dict[str, Any], epochs: bool, key: str, where: str
) -> None:
    (f,) = input_bound(RunView.of(_record(pipeline, epochs=epochs)), TH)
    assert f.id == f"input.{key}" and "every epoch" in f.title
    assert f".cache() right {where}" in f.fix and f.evidence["tfdata_repeats"] is True


def test_a_cache_is_not_asked_for_one_epoch_or_where_a_cache_is() -> None:
    one_epoch = _stages("Prefetch", "Batch", "ParallelMap", "TensorSlice",
                        cache_after=".map(decode)")  # fmt: skip
    (f,) = input_bound(RunView.of(_record(one_epoch)), TH)
    assert "cache() right" not in f.fix and f.id == "input.cpu"
    cached = _stages("Prefetch", "Batch", "Cache", "ParallelMap", "TensorSlice", cache_after=None)
    (f,) = input_bound(RunView.of(_record(cached, epochs=True)), TH)
    assert "cache() right" not in f.fix and f.id == "input.cpu"


def _short_steps(pipeline: dict[str, Any], duration: float, wait: float) -> RunRecord:
    loader = dataclasses.replace(
        make_loader(0, batch_size=32, pin_memory=False, prefetch_factor=None, dataset_len=None),
        dataset_type="tf.data",
    )
    events = [make_event("tfdata_pipeline", **pipeline)]
    steps = make_steps(3000, duration, wait)
    return make_record(steps, host=make_host_series(5), loaders=[loader], events=events)


IN_MEMORY = _stages("Prefetch", "Batch", "Cache", "TensorSlice")


def test_a_wait_no_longer_than_fetching_a_held_batch_is_the_fetch_itself() -> None:
    # 0.21 ms of 0.9 ms steps from a cached, prefetched in-memory pipeline: a 23 % wait
    # that no pipeline setting removes; fewer fetches (steps_per_execution) do.
    (f,) = input_bound(RunView.of(_short_steps(IN_MEMORY, 0.0009, 0.00021)), TH)
    assert (f.id, f.category) == ("input.handover", Category.FRAMEWORK_CONFIG)
    assert "0.21 ms" in f.title and "0.90 ms step" in f.title
    assert "steps_per_execution" in f.fix and "cheaper" not in f.fix
    assert f.evidence["data_wait_per_step_s"] == pytest.approx(0.00021, rel=0.01)


@pytest.mark.parametrize(
    ("pipeline", "wait"),
    [
        (IN_MEMORY, 0.0012),  # longer than a fetch costs: something else holds it up
        (_stages("Prefetch", "Batch", "ParallelMap", "TensorSlice"), 0.00021),  # work
        (_stages("Prefetch", "Batch", "TFRecord", file_sources=1, parallel_reads=True),
         0.00021),  # file reads
    ],
    ids=["long-wait", "map", "files"],
)
def test_a_longer_wait_or_a_pipeline_with_work_is_not_the_fetch(
    pipeline: dict[str, Any], wait: float
) -> None:
    (f,) = input_bound(RunView.of(_short_steps(pipeline, max(0.0009, 2 * wait), wait)), TH)
    assert f.id != "input.handover" and "steps_per_execution" not in f.fix
