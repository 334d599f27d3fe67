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
RANDOM_OP_PREFIXES = (
    "Random", "StatelessRandom", "StatelessTruncatedNormal", "StatelessMultinomial",
    "StatefulUniform", "StatefulStandardNormal", "StatefulTruncatedNormal", "Multinomial",
)  # fmt: skip
"""Operation types that draw random numbers: a stage that runs one (augmentation) gives
other data each epoch, so a cache must come before it."""
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


def _function_name(stage: Any) -> str | None:
    """The name of the Python function a stage runs (``heavy``, ``<lambda>``), if any."""
    wrapper = getattr(stage, "_map_func", None) or getattr(stage, "_predicate", None)
    name = getattr(getattr(wrapper, "_func", None), "__name__", None)
    return name if isinstance(name, str) else None


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
    "file_sources", "parallel_reads", "prefetch", "cache", "batch_size", "repeat",
    "random_stages", "cache_after"}``; each stage is ``{"op", "fn", "parallel",
    "buffer", "batch", "count", "python", "random", "generator", "files"}`` with what applies
    (``parallel`` and a repeat's ``count`` are ``-1`` for ``tf.data.AUTOTUNE`` and for
    ever).
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
        if cls.startswith("Repeat"):
            count = _number(getattr(stage, "_count", None))
            entry["count"] = -1 if count is None else count
        fn = _function_name(stage)
        if fn is not None:
            entry["fn"] = fn[:60]
        called = _function_ops(stage)
        if called & PYTHON_OPS:
            entry["python"] = True
        if any(op.startswith(RANDOM_OP_PREFIXES) for op in called):
            entry["random"] = True
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
    repeats = [s["count"] for s in stages if "count" in s]
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
        # Epochs the pipeline itself repeats its data (-1: for ever); 1: no repeat.
        "repeat": -1 if -1 in repeats else (max(repeats) if repeats else 1),
        "random_stages": sum(1 for s in stages if s.get("random")),
        "cache_after": cache_point(stages),
    }


WORK_OPS = {"Map": "map", "ParallelMap": "map", "FlatMap": "flat_map",
            "Interleave": "interleave", "ParallelInterleave": "interleave",
            "Filter": "filter"}  # fmt: skip
"""Stages whose work a cache saves on every epoch after the first, and the method that
makes each."""


def _stage_text(stage: dict[str, Any], nth: int) -> str:
    """A stage as the script wrote it: ``.map(heavy)``, ``.map(<lambda>) (map 2 from
    the source)``, ``the TFRecord source``."""
    method = WORK_OPS.get(stage["op"])
    if method is None:
        return f"the {stage['op']} source"
    fn = stage.get("fn", "...")
    text = f".{method}({fn})"
    if nth > 1 and fn in ("...", "<lambda>"):
        text += f" ({method} {nth} from the source)"
    return text


def cache_point(stages: list[dict[str, Any]]) -> str | None:
    """Where a ``.cache()`` saves the most work and keeps every epoch's data as the job
    makes it: after the last stage of work (``WORK_OPS``, file reads) that comes before
    the first random one, as the script wrote it (:func:`_stage_text`); ``None``: there
    is no such stage or a cache is there already."""
    source_first = list(reversed(stages))
    point: str | None = None
    seen: dict[str, int] = {}
    for s in source_first:
        op = s["op"]
        method = WORK_OPS.get(op, op)
        seen[method] = seen.get(method, 0) + 1
        if s.get("random") or op in ("Shuffle", "Cache", "Repeat"):
            break
        if op in WORK_OPS or s.get("files"):
            point = _stage_text(s, seen[method])
    if any(s["op"] == "Cache" for s in stages):
        return None
    return point


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
