"""Custom TensorFlow training loops run eagerly (``tf.GradientTape`` and the optimizer's
``apply``): the ``tf.data`` iterator's ``__next__`` is the wait for data, the model's
outermost call and the tape's ``gradient`` are compute, the optimizer's ``apply`` ends
the step, ``tf.train.CheckpointManager``'s saves are the ``checkpoint`` phase. Inside
``fit`` they stand aside (:mod:`trainmedic.probe.keras_hooks` marks its steps); traced
into a compiled function they tell :mod:`trainmedic.probe.tf_function_steps` so.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainmedic.probe.keras_apis import keras_degraded_data, patch, resolve
from trainmedic.record.events import EventKind

if TYPE_CHECKING:
    from types import ModuleType

    from trainmedic.probe.keras_hooks import KerasSteps
    from trainmedic.probe.runtime import Probe

_get_ident = threading.get_ident


def _install_checkpoint_manager(probe: Probe) -> None:
    """``tf.train.CheckpointManager.save`` (custom loops' checkpoints) as the
    ``checkpoint`` phase, when the training thread calls it outside another phase
    (BackupAndRestore's save, already one, may call it inside)."""
    cls = resolve("tensorflow.python.checkpoint.checkpoint_management.CheckpointManager")
    if not isinstance(cls, type) or "save" not in cls.__dict__:
        return
    from trainmedic.probe.steps import TRAIN

    part = probe.parts["keras"]
    tracker = probe.ensure_tracker()
    state = probe.state
    clock = probe.clock

    def make(original: Any) -> Any:
        def save(self: Any, *args: Any, **kwargs: Any) -> Any:
            entered = False
            try:
                if part.on and _get_ident() == state.training_ident and tracker.phase == TRAIN:
                    tracker.phase_enter(clock(), "checkpoint")
                    entered = True
            except Exception as exc:
                part.fail(exc)
            try:
                return original(self, *args, **kwargs)
            finally:
                if entered:
                    try:
                        tracker.phase_exit(clock())
                    except Exception as exc:
                        part.fail(exc)

        return save

    patch(cls, "save", make, probe)


def install_optimizer(cls: Any, method: str, tf: Any, steps: KerasSteps, probe: Probe) -> None:
    tracker = steps.tracker
    eagerly = tf.executing_eagerly

    def make(original: Any) -> Any:
        def apply(self: Any, *args: Any, **kwargs: Any) -> Any:
            # Traced inside a compiled function (fit's step, a tf.function loop) it runs
            # once, not every step: only an eager call is a step of a custom loop.
            if steps.in_fit:
                return original(self, *args, **kwargs)
            if not eagerly():
                functions = probe.tf_functions
                if functions is not None:
                    functions.traced()
                return original(self, *args, **kwargs)
            try:
                mine = steps.mine()
                if mine:
                    tracker.optimizer_enter(probe.clock())
            except Exception as exc:
                steps.part.fail(exc)
                mine = False
            result = original(self, *args, **kwargs)
            if mine:
                try:
                    tracker.optimizer_exit(probe.clock(), self)
                    functions = probe.tf_functions
                    if functions is not None:
                        functions.after_step()
                except Exception as exc:
                    steps.part.fail(exc)
            return result

        return apply

    patch(cls, method, make, probe)


def install_compute(
    cls: Any,
    name: str,
    kind: str,
    tf: Any,
    steps: KerasSteps | None,
    probe: Probe,
    on_traced: Callable[[], None] | None = None,
) -> None:
    """``cls.name`` as compute of kind ``kind`` when a custom loop runs it eagerly
    (outermost calls only: a model's layers are inside its own call); ``on_traced`` is
    called when it is traced into a compiled function instead, outside ``fit``."""
    eagerly = tf.executing_eagerly
    part = probe.parts["keras"]
    state = probe.state
    tracker = probe.ensure_tracker()

    def make(original: Any) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            keras = probe.keras if steps is None else steps
            if on_traced is not None and not eagerly() and not (keras and keras.in_fit):
                on_traced()
            if (
                not part.on
                or tracker.in_compute
                or _get_ident() != state.training_ident
                or (keras is not None and keras.in_fit)
                or not eagerly()
            ):
                return original(self, *args, **kwargs)
            try:
                tracker.compute_enter(probe.clock(), kind)
            except Exception as exc:
                part.fail(exc)
                return original(self, *args, **kwargs)
            try:
                return original(self, *args, **kwargs)
            finally:
                try:
                    tracker.compute_exit(probe.clock(), kind)
                except Exception as exc:
                    part.fail(exc)

        return wrapper

    patch(cls, name, make, probe)


def install_tensorflow(tf: ModuleType, probe: Probe) -> None:
    """The ``tf.data`` iterator's ``__next__``, timed as the wait for data of an eager
    custom loop (``for x, y in dataset:``)."""
    part = probe.parts["keras"]
    if not part.on:
        return
    owned = resolve("tensorflow.python.data.ops.iterator_ops.OwnedIterator")
    if owned is None:
        probe.emit(probe.event(
            EventKind.PROBE_DEGRADED,
            "probe: TensorFlow's tf.data iterator is not where the probe looks: the wait "
            "for data of custom loops is not measured",
            keras_degraded_data(str(getattr(tf, "__version__", "unknown")), [], ["data wait"]),
        ))  # fmt: skip
        return
    tracker = probe.ensure_tracker()
    clock = probe.clock
    state = probe.state
    eagerly = tf.executing_eagerly
    from trainmedic.probe import tf_function_steps, tf_pipelines

    functions = tf_function_steps.function_steps(probe, tf)

    def make(original: Any) -> Any:
        def __next__(self: Any) -> Any:
            if not eagerly():  # next(iterator) traced into a compiled step
                return functions.traced_batch(lambda: original(self))
            keras = probe.keras
            if not part.on or _get_ident() != state.training_ident or (keras and keras.in_fit):
                return original(self)
            try:
                tracker.loader_enter(clock())
            except Exception as exc:
                part.fail(exc)
                return original(self)
            try:
                batch = original(self)
            except BaseException:
                try:
                    tracker.loader_exit(clock(), None, False)
                except Exception as exc:
                    part.fail(exc)
                raise
            try:
                tracker.loader_exit(clock(), None, True)
            except Exception as exc:
                part.fail(exc)
            return batch

        return __next__

    patch(owned, "__next__", make, probe)
    tf_function_steps.install_traced_next(tf, functions, probe)
    _install_checkpoint_manager(probe)
    tape = resolve("tensorflow.python.eager.backprop.GradientTape")
    if tape is not None:
        install_compute(tape, "gradient", "backward", tf, None, probe, functions.traced)
    if not tf_function_steps.install_functions(tf, functions, probe):
        probe.emit(probe.event(
            EventKind.PROBE_DEGRADED,
            "probe: TensorFlow's tf.function class is not where the probe looks: the steps "
            "of custom loops whose step is a tf.function are not seen",
            keras_degraded_data(str(getattr(tf, "__version__", "unknown")), [], ["steps"]),
        ))  # fmt: skip
    dataset_cls = resolve("tensorflow.python.data.ops.dataset_ops.DatasetV2")
    if dataset_cls is not None:
        seen = tf_pipelines.pipelines(probe)

        def make_iter(original: Any) -> Any:
            def __iter__(self: Any) -> Any:
                iterator = original(self)
                keras = probe.keras
                if (
                    part.on
                    and _get_ident() == state.training_ident
                    and not (keras and keras.in_fit)
                ):
                    try:
                        seen.seen_dataset(self)
                    except Exception as exc:
                        part.fail(exc)
                return iterator

            return __iter__

        patch(dataset_cls, "__iter__", make_iter, probe)
