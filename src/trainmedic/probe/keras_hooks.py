"""Keras and TensorFlow jobs: steps, the wait for data, and phases, with no code change.

Installed when the job imports ``keras`` (Keras 3; ``tf.keras`` is Keras 3 from
TensorFlow 2.16 on) and ``tensorflow``; nothing here imports either first.

* **``fit``**: Keras runs each step in one compiled function that takes its batch
  from the ``tf.data`` iterator *inside* the graph, so no Python call brackets the
  wait for data. The callbacks' ``on_train_batch_begin``/``on_train_batch_end``
  (:class:`CallbackList`, wrapped once for every model) bracket the step; the wait
  is measured by one stage added at the tail of the job's input pipeline
  (:class:`ReadyStamp`, through every data adapter's ``get_tf_dataset``): a map
  with no parallelism, which runs when the step asks for its batch and writes
  when the batch left the pipeline (``tf.timestamp()``) into a variable read at
  the step's end. The step's wait for data is from its begin to that moment,
  its compute the rest. With ``steps_per_execution`` above 1 a call runs several
  steps and the stamp tells only the last batch: the steps are counted, the wait
  is not measured (``probe_degraded`` says so).
* **Phases**: ``evaluate`` (and ``fit``'s validation) is the ``eval`` phase,
  ``predict`` the ``predict`` phase, and ``ModelCheckpoint``'s and
  ``BackupAndRestore``'s saves the ``checkpoint`` phase: their time leaves the
  train step around them.
* **Custom loops** (``tf.GradientTape`` and ``optimizer.apply_gradients`` run
  eagerly): the ``tf.data`` iterator's ``__next__`` is the wait for data, the
  optimizer's ``apply`` the step's end. Inside ``fit`` the callbacks mark the
  steps instead.

Every hook runs on the training thread and does a few stores and, at a step's
end, one read of the stamp's variable (a few microseconds on the host); a hook
that fails switches the ``keras`` probe part off, never the job.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import ModuleType

    from trainmedic.probe.parts import Part
    from trainmedic.probe.runtime import Probe
    from trainmedic.probe.steps import StepTracker

_get_ident = threading.get_ident

#: Where Keras 3 keeps what is hooked: (attribute path, what is lost without it).
KERAS_APIS = (
    ("keras.src.callbacks.callback_list.CallbackList", "steps and phases of fit/evaluate"),
    ("keras.src.trainers.data_adapters.data_adapter.DataAdapter", "the wait for data in fit"),
    ("keras.src.callbacks.ModelCheckpoint", "ModelCheckpoint's saves as a phase"),
    ("keras.src.callbacks.BackupAndRestore", "BackupAndRestore's saves as a phase"),
    ("keras.src.optimizers.base_optimizer.BaseOptimizer", "steps of custom training loops"),
    ("keras.src.layers.layer.Layer", "the compute time of custom training loops"),
)


def _resolve(path: str) -> Any:
    """The object at a dotted ``path`` (module attributes after the longest importable
    module), or ``None``. Only packages the job imported are read: a submodule of one
    may be imported, a package the job never imported never is (a Keras job on JAX
    must not load TensorFlow)."""
    import importlib
    import sys

    parts = path.split(".")
    if parts[0] not in sys.modules:
        return None
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        module = sys.modules.get(name)
        if module is None:
            try:
                module = importlib.import_module(name)
            except Exception:
                continue
        obj: Any = module
        for attr in parts[cut:]:
            obj = getattr(obj, attr, None)
            if obj is None:
                return None
        return obj
    return None


class ReadyStamp:
    """When the step asked for its batch and when the batch left the job's input
    pipeline (wall seconds, ``tf.timestamp()``), from two variables set by stages added
    at the pipeline's tail, read at the step's end.

    The tail is ``zip(ticks, pipeline).map(stamp)``: ``zip`` asks the ticks first (a
    map with no parallelism, so it runs the moment the batch is asked for), then the
    pipeline, and ``stamp`` writes both times. TensorFlow may put a prefetch after the
    tail (its own optimisations, a distribution strategy's): the ask is then the
    prefetch's, ahead of the step, and the step waited only from its own begin. So the
    step's wait is from the later of its begin and the ask, to the batch's arrival;
    such a prefetch may also stamp a batch ahead of the step that takes it, and a step
    that finds no new stamp had its batch ready and waited nothing.

    The variables are made at the first pipeline, not at import: making them starts
    TensorFlow's runtime, after which the job could no longer set its GPU options.
    """

    def __init__(self, tf: Any) -> None:
        self._tf = tf
        self._var: Any = None
        self.last = 0.0
        """The arrival last read (wall seconds): a step whose stamp did not move took no
        batch through a stamped pipeline."""

    def _variable(self) -> Any:
        """``[asked, ready]``, one variable: one read a step."""
        if self._var is None:
            tf = self._tf
            with tf.init_scope(), tf.device("/CPU:0"):
                self._var = tf.Variable(tf.zeros([2], tf.float64), trainable=False,
                                        name="trainmedic_batch_times")  # fmt: skip
        return self._var

    def wrap(self, dataset: Any) -> Any:
        """``dataset`` with the stamping stages at its tail (elements unchanged)."""
        tf = self._tf
        times = self._variable()
        data = tf.data.Dataset
        ticks = data.range(1).repeat().map(lambda _: tf.timestamp())

        def stamp(t: Any, element: Any) -> Any:
            times.assign(tf.stack([t, tf.timestamp()]))
            return element

        return data.zip((ticks, dataset)).map(stamp)

    def read(self) -> tuple[float, float] | None:
        """``(asked, ready)`` of the newest batch (wall seconds), or ``None`` when no
        batch passed since the last read."""
        if self._var is None:
            return None
        asked, ready = (float(t) for t in self._var.numpy())
        if ready <= self.last:
            return None
        self.last = ready
        return asked, ready


class KerasSteps:
    """What the wrapped callbacks, adapters and optimizer call, on the training thread."""

    def __init__(self, probe: Probe, tracker: StepTracker, part: Part, stamp: ReadyStamp | None):
        self.probe = probe
        self.tracker = tracker
        self.part = part
        self.stamp = stamp
        self.begin: float | None = None
        self.in_fit = 0
        """``fit`` calls open: the callbacks mark steps, the optimizer hook stands aside."""
        self.multi_step_said = False

    def mine(self) -> bool:
        """Whether the calling thread is the training thread (adopting it before any step)."""
        if not self.part.on:
            return False
        state = self.probe.state
        return _get_ident() == state.training_ident or self.probe.adopt_training_thread()

    def batch_begin(self) -> None:
        self.begin = self.probe.clock()

    def batch_end(self, model: Any) -> None:
        """A ``fit`` step ended: its wait for data from the stamp, its compute the rest."""
        probe, tracker = self.probe, self.tracker
        now = probe.clock()
        begin = self.begin if self.begin is not None else now
        self.begin = None
        spe = getattr(model, "steps_per_execution", 1) if model is not None else 1
        stamps = self.stamp.read() if self.stamp is not None else None
        waited: tuple[float, float] | None = None
        if stamps is not None and (not isinstance(spe, int) or spe <= 1):
            # The stamps are wall time (tf.timestamp); the tracker's clock is monotonic.
            offset = time.time() - probe.clock()
            asked, ready = (t - offset for t in stamps)
            start = min(max(asked, begin), now)
            waited = (start, min(max(ready, start), now))
        elif self.stamp is not None and self.stamp.last and (not isinstance(spe, int) or spe <= 1):
            # No batch arrived during the step: a prefetch after the tail had it ready
            # (its stamp was read at an earlier step's end). The step took it at once.
            waited = (begin, begin)
        elif isinstance(spe, int) and spe > 1 and not self.multi_step_said:
            self.multi_step_said = True
            probe.emit(probe.event(
                "probe_degraded",
                f"probe: Keras runs {spe} steps a call (steps_per_execution): steps are "
                "counted, their wait for data is not measured",
                keras_degraded_data(_keras_version(), [], ["data wait"]),
            ))  # fmt: skip
        if waited is not None:
            tracker.loader_enter(waited[0])
            tracker.loader_exit(waited[1], None, True)
            start = waited[1]
        else:
            start = begin
        tracker.compute_enter(start, "forward")
        tracker.compute_exit(now, "forward")
        tracker.api_step(now)

    def phase(self, name: str | None) -> None:
        """A phase begins (``name``) or ends (``None``)."""
        now = self.probe.clock()
        if name is None:
            self.tracker.phase_exit(now)
        else:
            self.tracker.phase_enter(now, name)


def keras_degraded_data(
    version: str, missing: list[dict[str, str]], lost: list[str]
) -> dict[str, Any]:
    """A ``probe_degraded`` event's data for Keras (:mod:`trainmedic.diagnose.probe_coverage`)."""
    return {
        "framework": "keras",
        "keras": version,
        "missing": missing,
        "lost": lost,
        "parts_off": [],
    }


def _keras_version() -> str:
    import sys

    module = sys.modules.get("keras")
    return str(getattr(module, "__version__", "unknown"))


def install(keras: ModuleType, probe: Probe) -> None:
    """Hook what Keras 3 offers (module docstring); what it lacks is said in one
    ``probe_degraded`` event, and the rest is still measured."""
    part = probe.parts["keras"]
    if not part.on:
        return
    part.check()
    found = {path: _resolve(path) for path, _ in KERAS_APIS}
    missing = [
        {"feature": path.rsplit(".", 1)[-1], "api": path, "since": "3.0", "part": "keras",
         "lost": lost}
        for path, lost in KERAS_APIS if found[path] is None
    ]  # fmt: skip
    if missing:
        probe.emit(probe.event(
            "probe_degraded",
            f"probe: Keras {_keras_version()} lacks "
            + ", ".join(m["api"] for m in missing) + ": " + "; ".join(m["lost"] for m in missing),
            keras_degraded_data(_keras_version(), missing, [m["lost"] for m in missing]),
        ))  # fmt: skip
    tf = _resolve("tensorflow")
    backend = getattr(getattr(keras, "config", None), "backend", lambda: "")()
    stamp = ReadyStamp(tf) if tf is not None and backend == "tensorflow" else None
    steps = KerasSteps(probe, probe.ensure_tracker(), part, stamp)
    probe.keras = steps
    callbacks = found["keras.src.callbacks.callback_list.CallbackList"]
    if callbacks is not None:
        _install_callbacks(callbacks, steps, probe)
    adapter = found["keras.src.trainers.data_adapters.data_adapter.DataAdapter"]
    if adapter is not None and stamp is not None:
        _install_stamp(adapter, stamp, part, probe)
    for path in ("keras.src.callbacks.ModelCheckpoint", "keras.src.callbacks.BackupAndRestore"):
        cls = found[path]
        if cls is not None and hasattr(cls, "_save_model"):
            _wrap_phase(cls, "_save_model", "checkpoint", steps, probe)
    optimizer = found["keras.src.optimizers.base_optimizer.BaseOptimizer"]
    if optimizer is not None and tf is not None:
        _install_optimizer(optimizer, tf, steps, probe)
    layer = found["keras.src.layers.layer.Layer"]
    if layer is not None and tf is not None:
        _install_compute(layer, "__call__", "forward", tf, steps, probe)


def _patch(cls: Any, name: str, make: Callable[[Any], Any], probe: Probe) -> None:
    original = cls.__dict__.get(name) or getattr(cls, name)
    setattr(cls, name, functools.wraps(original)(make(original)))
    probe.restore.append(lambda: setattr(cls, name, original))


def _guarded(steps: KerasSteps, action: Callable[[], None]) -> None:
    try:
        if steps.mine():
            action()
    except Exception as exc:
        steps.part.fail(exc)


def _install_callbacks(cls: Any, steps: KerasSteps, probe: Probe) -> None:
    def batch_begin(original: Any) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            _guarded(steps, steps.batch_begin)
            return original(self, *args, **kwargs)

        return wrapper

    def batch_end(original: Any) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            # The step ends before the other callbacks run: their time (a checkpoint,
            # logging) is the loop's, or a phase of its own.
            _guarded(steps, lambda: steps.batch_end(getattr(self, "model", None)))
            return original(self, *args, **kwargs)

        return wrapper

    def phase(name: str | None) -> Callable[[Any], Any]:
        def make(original: Any) -> Any:
            def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
                if name is not None:
                    _guarded(steps, lambda: steps.phase(name))
                    return original(self, *args, **kwargs)
                try:
                    return original(self, *args, **kwargs)
                finally:
                    _guarded(steps, lambda: steps.phase(None))

            return wrapper

        return make

    def fit(entering: bool) -> Callable[[Any], Any]:
        def make(original: Any) -> Any:
            def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
                steps.in_fit = max(0, steps.in_fit + (1 if entering else -1))
                return original(self, *args, **kwargs)

            return wrapper

        return make

    _patch(cls, "on_train_batch_begin", batch_begin, probe)
    _patch(cls, "on_train_batch_end", batch_end, probe)
    _patch(cls, "on_test_begin", phase("eval"), probe)
    _patch(cls, "on_test_end", phase(None), probe)
    _patch(cls, "on_predict_begin", phase("predict"), probe)
    _patch(cls, "on_predict_end", phase(None), probe)
    _patch(cls, "on_train_begin", fit(True), probe)
    _patch(cls, "on_train_end", fit(False), probe)


def _subclasses(cls: type) -> Iterator[type]:
    sub: type
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


class Pipelines:
    """Tells the supervisor of each ``tf.data`` pipeline the job trains from, once: a
    loader record (``tf.data``, its batch size) and a ``tfdata_pipeline`` event with its
    stages (:func:`trainmedic.probe.tf_data.describe`)."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.seen: dict[str, int] = {}

    def seen_dataset(self, dataset: Any) -> None:
        from trainmedic.probe.tf_data import describe, summary
        from trainmedic.record.types import LoaderInfo

        probe = self.probe
        described = describe(dataset)
        line = summary(described)
        if line in self.seen:
            return
        self.seen[line] = loader_id = len(self.seen) + 1
        batch = described["batch_size"]
        probe.emit(LoaderInfo(
            t=probe.wall(), pid=probe.pid, loader_id=loader_id, num_workers=0,
            batch_size=batch if isinstance(batch, int) and batch > 0 else None,
            pin_memory=False, prefetch_factor=None, persistent_workers=False,
            dataset_type="tf.data", dataset_len=None,
        ))  # fmt: skip
        probe.emit(probe.event("tfdata_pipeline", f"tf.data pipeline {loader_id}: {line}",
                               {**described, "loader_id": loader_id, "summary": line}))  # fmt: skip


def pipelines(probe: Probe) -> Pipelines:
    """The probe's :class:`Pipelines` (one per process)."""
    found = getattr(probe, "tf_pipelines", None)
    if found is None:
        found = Pipelines(probe)
        probe.tf_pipelines = found
    return found


def _install_stamp(base: type, stamp: ReadyStamp, part: Part, probe: Probe) -> None:
    seen = pipelines(probe)

    def make(original: Any) -> Any:
        def get_tf_dataset(self: Any, *args: Any, **kwargs: Any) -> Any:
            dataset = original(self, *args, **kwargs)
            if not part.on:
                return dataset
            try:
                seen.seen_dataset(dataset)
                return stamp.wrap(dataset)
            except Exception as exc:
                part.fail(exc)
                return dataset

        return get_tf_dataset

    for cls in _subclasses(base):
        if "get_tf_dataset" in cls.__dict__:
            _patch(cls, "get_tf_dataset", make, probe)


def _wrap_phase(cls: Any, name: str, phase: str, steps: KerasSteps, probe: Probe) -> None:
    def make(original: Any) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            _guarded(steps, lambda: steps.phase(phase))
            try:
                return original(self, *args, **kwargs)
            finally:
                _guarded(steps, lambda: steps.phase(None))

        return wrapper

    _patch(cls, name, make, probe)


def _install_optimizer(cls: Any, tf: Any, steps: KerasSteps, probe: Probe) -> None:
    tracker = steps.tracker
    eagerly = tf.executing_eagerly

    def make(original: Any) -> Any:
        def apply(self: Any, *args: Any, **kwargs: Any) -> Any:
            # Traced inside a compiled function (fit's step, a tf.function loop) it runs
            # once, not every step: only an eager call is a step of a custom loop.
            if steps.in_fit or not eagerly():
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
                except Exception as exc:
                    steps.part.fail(exc)
            return result

        return apply

    _patch(cls, "apply", make, probe)


def _install_compute(
    cls: Any, name: str, kind: str, tf: Any, steps: KerasSteps | None, probe: Probe
) -> None:
    """``cls.name`` as compute of kind ``kind`` when a custom loop runs it eagerly
    (outermost calls only: a model's layers are inside its own call)."""
    eagerly = tf.executing_eagerly
    part = probe.parts["keras"]
    state = probe.state
    tracker = probe.ensure_tracker()

    def make(original: Any) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            keras = probe.keras if steps is None else steps
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

    _patch(cls, name, make, probe)


def install_tensorflow(tf: ModuleType, probe: Probe) -> None:
    """The ``tf.data`` iterator's ``__next__``, timed as the wait for data of an eager
    custom loop (``for x, y in dataset:``)."""
    part = probe.parts["keras"]
    if not part.on:
        return
    owned = _resolve("tensorflow.python.data.ops.iterator_ops.OwnedIterator")
    if owned is None:
        probe.emit(probe.event(
            "probe_degraded",
            "probe: TensorFlow's tf.data iterator is not where the probe looks: the wait "
            "for data of custom loops is not measured",
            keras_degraded_data(str(getattr(tf, "__version__", "unknown")), [], ["data wait"]),
        ))  # fmt: skip
        return
    tracker = probe.ensure_tracker()
    clock = probe.clock
    state = probe.state

    def make(original: Any) -> Any:
        def __next__(self: Any) -> Any:
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

    _patch(owned, "__next__", make, probe)
    tape = _resolve("tensorflow.python.eager.backprop.GradientTape")
    if tape is not None:
        _install_compute(tape, "gradient", "backward", tf, None, probe)
    dataset_cls = _resolve("tensorflow.python.data.ops.dataset_ops.DatasetV2")
    if dataset_cls is not None:
        seen = pipelines(probe)

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

        _patch(dataset_cls, "__iter__", make_iter, probe)
