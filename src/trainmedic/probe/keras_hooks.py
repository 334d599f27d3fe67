"""Keras and TensorFlow jobs: steps, the wait for data, and phases, with no code change.

Installed when the job imports ``keras`` (Keras 3; ``tf.keras`` is Keras 3 from
TensorFlow 2.16 on) and ``tensorflow``; nothing here imports either first.

* **``fit``**: Keras runs each step in one compiled function that takes its batch
  from the ``tf.data`` iterator *inside* the graph, so no Python call brackets the
  wait for data. The callbacks' ``on_train_batch_begin``/``on_train_batch_end``
  (:class:`CallbackList`, wrapped once for every model) bracket the step; the wait
  is measured inside the compiled step, around the iterator's ``get_next`` that
  Keras traces into it (:class:`ReadyStamp`), and read at the step's end; the
  step's compute is the rest. Each pipeline fit trains from is described once
  (``get_tf_dataset`` of every data adapter, :class:`Pipelines`). With
  ``steps_per_execution`` above 1 a call runs several steps: they are counted,
  their wait is not measured (``probe_degraded`` says so).
* **Phases**: ``evaluate`` (and ``fit``'s validation) is the ``eval`` phase,
  ``predict`` the ``predict`` phase, and ``ModelCheckpoint``'s and
  ``BackupAndRestore``'s saves the ``checkpoint`` phase: their time leaves the
  train step around them.
* **Custom loops** (``tf.GradientTape`` and ``optimizer.apply_gradients`` run
  eagerly): the ``tf.data`` iterator's ``__next__`` is the wait for data, the
  model's outermost call and the tape's ``gradient`` are compute, the
  optimizer's ``apply`` ends the step. Inside ``fit`` the callbacks mark the
  steps instead.

Every hook runs on the training thread and does a few stores and, at some steps'
ends, one read of the stamp's variable (about 40 us: :data:`READ_EVERY_S`); a hook
that fails switches the ``keras`` probe part off, never the job.
"""

from __future__ import annotations

import functools
import threading
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


READ_EVERY_S = 0.004
"""Steps at least this long (seconds) read the stamps at their end: one read costs about
40 us on a CPU, 1 % of such a step."""
READ_EVERY_STEPS = 8
"""Shorter steps read them every this many steps; the steps between get the mean wait
of the steps the read covers."""


class ReadyStamp:
    """How long fit's steps waited for their batch, as the compiled step itself measures
    it: totals in one variable, read at a step's end.

    Keras traces its step function once; the iterator's ``get_next`` is called while it
    traces (:func:`_install_get_next` wraps it). There the wrapper adds, around the
    graph's own ``get_next``, a ``tf.timestamp()`` before it, one after the batch (with
    a control dependency on the batch), and adds their difference and one step to the
    variable's totals. They run inside the step's graph at every step: a few
    microseconds, no Python, no change to the pipeline or its elements.

    Reading the variable costs about 40 us; a step that long or longer than
    :data:`READ_EVERY_S` reads it, shorter ones every :data:`READ_EVERY_STEPS` steps. A
    read gives the wait of the steps since the last one (exact for one step).

    The variable is made at the first trace, not at import: making it starts
    TensorFlow's runtime, after which the job could no longer set its GPU options.
    """

    def __init__(self, tf: Any) -> None:
        self._tf = tf
        self._var: Any = None
        self._last = (0.0, 0.0)
        self.mean_wait: float | None = None
        """The mean wait a step (seconds) of the steps the last read covered."""
        self.depth = threading.local()

    def _variable(self) -> Any:
        """``[total wait (s), steps]``."""
        if self._var is None:
            tf = self._tf
            with tf.init_scope(), tf.device("/CPU:0"):
                self._var = tf.Variable(tf.zeros([2], tf.float64), trainable=False,
                                        name="trainmedic_batch_wait")  # fmt: skip
        return self._var

    def around(self, get_next: Callable[[], Any], failed: Callable[[Exception], None]) -> Any:
        """``get_next()`` traced between the two stamps (see the class docstring), called
        exactly once whatever fails: a second call would take a second batch a step."""
        tf = self._tf
        try:
            totals = self._variable()
            asked = tf.timestamp()
        except Exception as exc:
            failed(exc)
            return get_next()
        with tf.control_dependencies([asked]):
            batch = get_next()
        try:
            tensors = [t for t in tf.nest.flatten(batch) if isinstance(t, tf.Tensor)]
            with tf.control_dependencies(tensors):
                ready = tf.timestamp()
            totals.assign_add(tf.stack([ready - asked, tf.constant(1.0, tf.float64)]))
        except Exception as exc:
            failed(exc)
        return batch

    @property
    def active(self) -> bool:
        """Whether a step was stamped yet."""
        return self._var is not None

    def read(self) -> float | None:
        """The mean wait a step (seconds) since the last read, or ``None`` when no stamped
        step ran since."""
        if self._var is None:
            return None
        total, count = (float(t) for t in self._var.numpy())
        waited, steps = total - self._last[0], count - self._last[1]
        self._last = (total, count)
        if steps < 1:
            return None
        self.mean_wait = max(0.0, waited / steps)
        return self.mean_wait


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
        self.unread = 0
        """Steps since the stamps were last read."""

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
        stamp = self.stamp
        wait: float | None = None
        if stamp is not None and stamp.active and (not isinstance(spe, int) or spe <= 1):
            self.unread += 1
            due = now - begin >= READ_EVERY_S or self.unread >= READ_EVERY_STEPS
            if due or stamp.mean_wait is None:
                self.unread = 0
                wait = stamp.read()
            if wait is None:
                wait = stamp.mean_wait
        elif isinstance(spe, int) and spe > 1 and not self.multi_step_said:
            self.multi_step_said = True
            probe.emit(probe.event(
                "probe_degraded",
                f"probe: Keras runs {spe} steps a call (steps_per_execution): steps are "
                "counted, their wait for data is not measured",
                keras_degraded_data(_keras_version(), [], ["data wait"]),
            ))  # fmt: skip
        if wait is not None:
            # The step takes its batch first: its wait is at its start.
            start = min(begin + wait, now)
            tracker.loader_enter(begin)
            tracker.loader_exit(start, None, True)
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
        _install_pipelines(adapter, part, probe)
    if stamp is not None:
        _install_get_next(stamp, steps, probe)
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


def _install_pipelines(base: type, part: Part, probe: Probe) -> None:
    """Each data adapter's ``get_tf_dataset``: the pipeline fit trains from, described."""
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

    for cls in _subclasses(base):
        if "get_tf_dataset" in cls.__dict__:
            _patch(cls, "get_tf_dataset", make, probe)


ITERATORS = (
    "tensorflow.python.data.ops.iterator_ops.OwnedIterator",
    "tensorflow.python.distribute.input_lib.DistributedIteratorBase",
)
"""The iterators whose ``get_next`` fit's step traces: a plain pipeline's, and a
distribution strategy's (which calls its workers' iterators inside: the outermost call
is stamped)."""


def _install_get_next(stamp: ReadyStamp, steps: KerasSteps, probe: Probe) -> None:
    tf = stamp._tf
    part = steps.part
    eagerly = tf.executing_eagerly

    def make(original: Any) -> Any:
        def get_next(self: Any, *args: Any, **kwargs: Any) -> Any:
            depth = getattr(stamp.depth, "n", 0)
            # Only while fit's step is traced (an eager call is a custom loop's, timed by
            # __next__), and only the outermost iterator of a strategy's.
            if depth or not part.on or not steps.in_fit or eagerly():
                return original(self, *args, **kwargs)
            stamp.depth.n = depth + 1
            try:
                return stamp.around(lambda: original(self, *args, **kwargs), part.fail)
            finally:
                stamp.depth.n = depth

        return get_next

    for path in ITERATORS:
        cls = _resolve(path)
        if cls is not None and hasattr(cls, "get_next"):
            _patch(cls, "get_next", make, probe)


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
