"""Why a Keras or TensorFlow job waits for its ``tf.data`` pipeline, and the exact fix.

The probe measures the wait (:mod:`trainmedic.probe.keras_hooks`) and describes
the pipeline the job trains from (a ``tfdata_pipeline`` event,
:func:`trainmedic.probe.tf_data.describe`). When the job waits for data, the
first of these that the pipeline shows is the cause, in the order a fix pays
off most:

1. ``from_generator``, or Python in a stage's function (``tf.py_function``,
   ``tf.numpy_function``): one interpreter lock runs it, whatever the cores
   (``input.gil``);
2. a ``map`` without ``num_parallel_calls``: one element at a time on one core
   (``input.workers``: the pipeline's parallelism is the setting to raise);
3. files read one after another (``TFRecordDataset``, ``TextLineDataset`` over
   several files without a parallel ``interleave``) (``input.io``);
4. no ``prefetch`` after the last ``batch``: the pipeline and the step take
   turns (``input.workers``);
5. the job goes over the data again (a second epoch, or a ``repeat``) and the
   pipeline redoes its work each time, with no ``cache``: the cache goes after the
   last stage of work that comes before anything random (``input.cpu``, or
   ``input.io`` when that work is reading files);
6. a prefetched pipeline with no per-element work (in-memory tensors, batched; no
   map, filter, interleave, file or Python stage) whose wait per step is under
   ``Thresholds.tfdata_handover_s``: the wait is what fetching one batch from the
   iterator costs, which matters only against very short steps; the fix is fetching
   less often (Keras's ``steps_per_execution``) (``input.handover``);
7. otherwise the pipeline runs in parallel and prefetches: its work takes the
   CPU it has (``input.cpu``), with the job's cores as evidence.

Each finding gives the stages it read and the settings to write.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from trainmedic.diagnose.input_causes import InputCause
from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Category
from trainmedic.record.events import EventKind

TFDATA = "tf.data"
"""The ``dataset_type`` of a loader record the probe makes for a ``tf.data`` pipeline."""

_PARALLEL_MAP = "dataset.map(fn, num_parallel_calls=tf.data.AUTOTUNE)"
_PREFETCH = "end the pipeline with .prefetch(tf.data.AUTOTUNE)"


def trains_from_tfdata(view: RunView) -> bool:
    """Whether the job's training loaders are ``tf.data`` pipelines."""
    loaders = view.train_loaders
    return bool(loaders) and all(lo.dataset_type == TFDATA for lo in loaders)


def pipeline(view: RunView) -> Mapping[str, Any] | None:
    """The described pipeline of the first training loader (``None``: not described)."""
    loaders = view.train_loaders
    if not loaders:
        return None
    lo = loaders[0]
    for e in view.record.events:
        if (
            e.kind == EventKind.TFDATA_PIPELINE
            and e.pid == lo.pid
            and e.data.get("loader_id") == lo.loader_id
        ):
            return e.data
    return None


_NO_WORK_OPS = frozenset(
    {"TensorSlice", "Tensor", "Range", "Batch", "Prefetch", "Cache", "Shuffle", "Repeat",
     "Take", "Skip", "Options", "Zip", "Concatenate", "Unbatch", "Rebatch", "Shard"}
)  # fmt: skip
"""tf.data stages that do no per-element work of the user's: sources of tensors held in
memory and the stages that only rearrange or pass elements on."""


def _handover_wait_s(
    view: RunView, p: Mapping[str, Any], th: Thresholds
) -> tuple[float, float] | None:
    """(mean wait per step, mean step), seconds, when the pipeline does no per-element
    work and prefetches and each step's wait is under ``th.tfdata_handover_s``; else
    ``None``."""
    stages = p.get("stages")
    if not p.get("prefetch") or not isinstance(stages, list) or not stages:
        return None
    ops = [s.get("op") for s in stages if isinstance(s, dict)]
    if len(ops) != len(stages) or not all(op in _NO_WORK_OPS for op in ops):
        return None
    if any(s.get("files") or s.get("python") or s.get("generator") for s in stages):
        return None
    share, step = view.summary.data_wait_share, view.summary.step_time_mean_s
    if share is None or step is None or step <= 0:
        return None
    wait = share * step
    return (wait, step) if wait < th.tfdata_handover_s else None


def repeats(view: RunView, p: Mapping[str, Any]) -> bool:
    """Whether the job goes over its pipeline's data more than once: a ``repeat`` in the
    pipeline, or a second epoch the probe saw (a ``tfdata_epochs`` event)."""
    if p.get("repeat", 1) != 1:
        return True
    pids = {lo.pid for lo in view.train_loaders}
    return any(e.kind == EventKind.TFDATA_EPOCHS and e.pid in pids for e in view.record.events)


def tfdata_cause(view: RunView, th: Thresholds) -> InputCause | None:
    """The cause of a wait for a ``tf.data`` pipeline (module docstring), or ``None``
    when the job trains from none."""
    if not trains_from_tfdata(view):
        return None
    p = pipeline(view) or {}
    line = str(p.get("summary") or "not described")
    evidence: dict[str, Any] = {"tfdata_pipeline": line}
    for key in ("serial_maps", "python_stages", "generator", "file_sources",
                "parallel_reads", "prefetch", "cache", "batch_size", "repeat",
                "random_stages", "cache_after"):  # fmt: skip
        if key in p:
            evidence[f"tfdata_{key}"] = p[key]
    s = view.summary
    if s.job_cpu_mean_cores is not None:
        evidence["job_cpu_cores"] = s.job_cpu_mean_cores
    if view.usable_cores is not None:
        evidence["usable_cores"] = view.usable_cores

    def cause(key: str, category: Category, title: str, fix: str) -> InputCause:
        return InputCause(key, category, title, fix, evidence, remedies="")

    if p.get("generator"):
        return cause(
            "gil", Category.FRAMEWORK_CONFIG,
            f"the tf.data pipeline reads from Dataset.from_generator, whose Python "
            f"generator runs one element at a time under the interpreter lock ({line})",
            "Move the per-element work out of the generator: yield file names or indices "
            "and load them in " + _PARALLEL_MAP + ", or write the data to TFRecord files "
            "once and read them with tf.data.TFRecordDataset; then " + _PREFETCH + ".",
        )  # fmt: skip
    if p.get("python_stages"):
        return cause(
            "gil", Category.FRAMEWORK_CONFIG,
            f"a tf.data stage calls Python (tf.py_function or tf.numpy_function), which "
            f"one interpreter lock runs whatever num_parallel_calls says ({line})",
            "Write the stage's work in TensorFlow ops (tf.image, tf.strings, tf.io) so that "
            f"{_PARALLEL_MAP} runs it on every core; then {_PREFETCH}.",
        )  # fmt: skip
    if p.get("serial_maps"):
        return cause(
            "workers", Category.FRAMEWORK_CONFIG,
            f"the tf.data pipeline maps one element at a time: map() without "
            f"num_parallel_calls runs on one core ({line})",
            f"Run the map in parallel: {_PARALLEL_MAP}; {_PREFETCH}; and, when the "
            "mapped data fit in memory and repeat across epochs, .cache() after the map.",
        )  # fmt: skip
    if p.get("file_sources") and not p.get("parallel_reads"):
        return cause(
            "io", Category.IO,
            f"the tf.data pipeline reads its files one after another ({line})",
            "Read several files at once: tf.data.Dataset.list_files(pattern).interleave("
            "tf.data.TFRecordDataset, num_parallel_calls=tf.data.AUTOTUNE, "
            f"deterministic=False) (or num_parallel_reads= on TFRecordDataset); {_PREFETCH}.",
        )  # fmt: skip
    if p and not p.get("prefetch"):
        return cause(
            "workers", Category.FRAMEWORK_CONFIG,
            f"the tf.data pipeline has no prefetch after its batch: the pipeline and the "
            f"training step take turns instead of overlapping ({line})",
            f"{_PREFETCH[0].upper()}{_PREFETCH[1:]}: the next batches are then made while "
            "the step runs.",
        )  # fmt: skip
    where = p.get("cache_after")
    if where and not p.get("cache") and repeats(view, p):
        evidence["tfdata_repeats"] = True
        reads = bool(p.get("file_sources"))
        before = (" and before the first random stage, so that each epoch still gets "
                  "new augmentations" if p.get("random_stages") else "")  # fmt: skip
        return cause(
            "io" if reads else "cpu", Category.IO if reads else Category.CPU,
            f"the tf.data pipeline {'reads its files and ' if reads else ''}redoes its work "
            f"on every epoch: it goes over the same data again with no cache ({line})",
            f"Add .cache() right after {where}{before}: the work is then done once, in "
            "the first epoch. Use .cache() in memory when the prepared data fit in RAM, "
            "else .cache('/local/disk/path') on a local disk; keep "
            ".prefetch(tf.data.AUTOTUNE) at the end.",
        )  # fmt: skip
    handover = _handover_wait_s(view, p, th)
    if handover is not None:
        wait_s, step_s = handover
        evidence["data_wait_per_step_s"] = round(wait_s, 6)
        evidence["tfdata_handover_max_s"] = th.tfdata_handover_s
        return cause(
            "handover", Category.FRAMEWORK_CONFIG,
            f"each step takes {wait_s * 1e3:.2f} ms to fetch a batch the pipeline already "
            f"holds ({line}: no per-element work, prefetched): that is the cost of fetching "
            f"one batch from the tf.data iterator, large against a {step_s * 1e3:.2f} ms step",
            "Fetch less often: model.compile(..., steps_per_execution=32) runs 32 steps per "
            "call, fetching their batches inside one compiled function (a custom loop: "
            "loop over several batches inside the tf.function); or train on larger batches.",
        )  # fmt: skip
    return cause(
        "cpu", Category.CPU,
        f"the tf.data pipeline runs in parallel and prefetches, and its work still takes "
        f"longer than the step ({line})",
        "Make each element cheaper (decode smaller images, move augmentation to the GPU "
        "with keras.layers preprocessing inside the model), .cache() what repeats across "
        "epochs, or run where more CPU cores are available.",
    )  # fmt: skip
