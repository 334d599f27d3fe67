"""The ``tf.data`` pipelines a Keras or TensorFlow job trains from, described once each.

A loader record (``tf.data``, its batch size) and a ``tfdata_pipeline`` event with its
stages (:func:`trainmedic.probe.tf_data.describe`) for each pipeline ``fit`` or a custom
loop takes batches from; a ``tfdata_epochs`` event when the job goes over its data again.
Installed by :mod:`trainmedic.probe.keras_hooks` (``fit``'s data adapters) and
:mod:`trainmedic.probe.tf_custom_loops` (the datasets a custom loop iterates).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainmedic.probe.keras_apis import patch, subclasses
from trainmedic.record.events import EventKind

if TYPE_CHECKING:
    from trainmedic.probe.parts import Part
    from trainmedic.probe.runtime import Probe


class Pipelines:
    """Tells the supervisor of each ``tf.data`` pipeline the job trains from, once: a
    loader record (``tf.data``, its batch size) and a ``tfdata_pipeline`` event with its
    stages (:func:`trainmedic.probe.tf_data.describe`)."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.seen: dict[str, int] = {}
        self.repeat_said = False

    def epoch_again(self, how: str) -> None:
        """The job goes over its data again (a second epoch), said once in a
        ``tfdata_epochs`` event: what a ``.cache()`` would save from now on."""
        if self.repeat_said:
            return
        self.repeat_said = True
        probe = self.probe
        probe.emit(probe.event(EventKind.TFDATA_EPOCHS, f"tf.data: a second epoch ({how})",
                               {"how": how}))  # fmt: skip

    def seen_dataset(self, dataset: Any) -> None:
        from trainmedic.probe.tf_data import describe, summary
        from trainmedic.record.types import LoaderInfo

        probe = self.probe
        described = describe(dataset)
        line = summary(described)
        if line in self.seen:
            self.epoch_again("the pipeline iterated again")
            return
        self.seen[line] = loader_id = len(self.seen) + 1
        batch = described["batch_size"]
        probe.emit(LoaderInfo(
            t=probe.wall(), pid=probe.pid, loader_id=loader_id, num_workers=0,
            batch_size=batch if isinstance(batch, int) and batch > 0 else None,
            pin_memory=False, prefetch_factor=None, persistent_workers=False,
            dataset_type="tf.data", dataset_len=None,
        ))  # fmt: skip
        probe.emit(probe.event(EventKind.TFDATA_PIPELINE, f"tf.data pipeline {loader_id}: {line}",
                               {**described, "loader_id": loader_id, "summary": line}))  # fmt: skip


def pipelines(probe: Probe) -> Pipelines:
    """The probe's :class:`Pipelines` (one per process)."""
    found = probe.tf_pipelines
    if found is None:
        found = Pipelines(probe)
        probe.tf_pipelines = found
    return found


def install_pipelines(base: type, method: str, part: Part, probe: Probe) -> None:
    """Each data adapter's ``method`` (``get_tf_dataset``): the pipeline fit trains
    from, described."""
    seen = pipelines(probe)

    def make(original: Any) -> Any:
        def get_tf_dataset(self: Any, *args: Any, **kwargs: Any) -> Any:
            dataset = original(self, *args, **kwargs)
            if part.on:
                try:
                    seen.seen_dataset(dataset)
                except Exception as exc:
                    part.fail(exc)
            return dataset

        return get_tf_dataset

    for cls in [base, *subclasses(base)]:
        if method in cls.__dict__:
            patch(cls, method, make, probe)
