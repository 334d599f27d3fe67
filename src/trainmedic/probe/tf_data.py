"""What a job's ``tf.data`` pipeline is made of, read from its Python objects.

A ``tf.data.Dataset`` keeps its inputs (``_inputs()``) and, for the stages that run
a function, the traced function: enough to tell the settings that decide its speed
without running it. :func:`describe` walks from the pipeline's tail to its sources
and returns each stage with what matters for speed: a ``map`` without
``num_parallel_calls`` (serial), Python in a stage's function (``tf.py_function``,
``tf.numpy_function``: it holds the GIL), ``from_generator`` (its generator runs
under the GIL, one element at a time), file sources, ``interleave``, ``cache``,
``prefetch`` and the batch size. The diagnosis names the cause of a wait for data
from it (:mod:`trainmedic.diagnose.tfdata_causes`).

Read once per pipeline the job builds; nothing here runs the pipeline.
"""

from __future__ import annotations

import contextlib
from typing import Any

MAX_STAGES = 64
"""Stages read at most (a pipeline zipped from many sources stops there)."""
PYTHON_OPS = frozenset({"EagerPyFunc", "PyFunc", "PyFuncStateless"})
"""Operations that call back into Python (``tf.py_function``, ``tf.numpy_function``)."""
FILE_SOURCES = frozenset({"TFRecordDatasetV2", "TFRecordDataset", "TextLineDatasetV2",
                          "TextLineDataset", "FixedLengthRecordDatasetV2",
                          "FixedLengthRecordDataset"})  # fmt: skip


def _number(value: Any) -> int | None:
    """A stage's setting as an int (a scalar tensor, a Python int), else ``None``."""
    if value is None:
        return None
    with contextlib.suppress(AttributeError):
        value = value.numpy()
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _function_ops(stage: Any) -> set[str]:
    """The operation types in the function a stage runs (``map``, ``flat_map``...)."""
    wrapper = getattr(stage, "_map_func", None) or getattr(stage, "_predicate", None)
    graph = getattr(getattr(wrapper, "function", None), "graph", None)
    if graph is None:
        return set()
    try:
        return {op.type for op in graph.get_operations()}
    except Exception:
        return set()


def _name(stage: Any) -> str:
    name = type(stage).__name__.lstrip("_")
    for suffix in ("DatasetV2", "DatasetV1", "Dataset"):
        if name.endswith(suffix) and name != suffix:
            name = name[: -len(suffix)]
            break
    return name


def describe(dataset: Any) -> dict[str, Any]:
    """The pipeline of ``dataset``, tail first: its stages and what they say of its speed.

    Returns ``{"stages": [...], "serial_maps", "python_stages", "generator",
    "file_sources", "parallel_reads", "prefetch", "cache", "batch_size"}``; each stage
    is ``{"op", "parallel", "buffer", "batch", "python", "generator", "files"}`` with
    what applies (``parallel`` is ``-1`` for ``tf.data.AUTOTUNE``).
    """
    stages: list[dict[str, Any]] = []
    seen: set[int] = set()
    todo = [dataset]
    while todo and len(stages) < MAX_STAGES:
        stage = todo.pop(0)
        if id(stage) in seen:
            continue
        seen.add(id(stage))
        cls = type(stage).__name__.lstrip("_")
        entry: dict[str, Any] = {"op": _name(stage)}
        parallel = _number(getattr(stage, "_num_parallel_calls", None))
        if parallel is not None:
            entry["parallel"] = parallel
        for attr, key in (("_buffer_size", "buffer"), ("_batch_size", "batch")):
            n = _number(getattr(stage, attr, None))
            if n is not None:
                entry[key] = n
        called = _function_ops(stage)
        if called & PYTHON_OPS:
            entry["python"] = True
        if "GeneratorDataset" in called:
            entry["generator"] = True
        if cls in FILE_SOURCES:
            entry["files"] = True
        stages.append(entry)
        try:
            inputs = list(stage._inputs())
        except Exception:
            inputs = []
        todo.extend(inputs)
    ops = [s["op"] for s in stages]
    batches = [s["batch"] for s in stages if "batch" in s]
    return {
        "stages": stages,
        "serial_maps": sum(1 for s in stages if s["op"] == "Map"),
        "python_stages": sum(1 for s in stages if s.get("python")),
        "generator": any(s.get("generator") for s in stages),
        "file_sources": sum(1 for s in stages if s.get("files")),
        "parallel_reads": any(s["op"] == "ParallelInterleave" for s in stages),
        # A prefetch anywhere after the last batch (towards the tail) overlaps the step.
        "prefetch": "Prefetch" in ops[: ops.index("Batch") if "Batch" in ops else len(ops)],
        "cache": "Cache" in ops,
        "batch_size": batches[0] if batches else None,
    }


def summary(described: dict[str, Any]) -> str:
    """The pipeline in one line, source first: ``TensorSlice > Map > Batch(32)``."""
    parts = []
    for s in reversed(described["stages"]):
        text = s["op"]
        if "batch" in s:
            text += f"({s['batch']})"
        elif "parallel" in s:
            text += f"(parallel={'AUTOTUNE' if s['parallel'] == -1 else s['parallel']})"
        if s.get("python"):
            text += "[python]"
        if s.get("generator"):
            text += "[generator]"
        parts.append(text)
    return " > ".join(parts)
