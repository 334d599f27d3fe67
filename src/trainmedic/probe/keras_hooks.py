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
  (``get_tf_dataset`` of every data adapter, :mod:`trainmedic.probe.tf_pipelines`). With
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
* **Custom loops whose step is a ``tf.function``**: a function whose trace takes a
  gradient or applies an optimizer is a training step
  (:mod:`trainmedic.probe.tf_function_steps`); each
  eager call of it is one step, its compute the call. The batch is waited for
  either before the call (an eagerly iterated pipeline: ``__next__``) or inside it
  (``next(iterator)`` traced into the function): then a stamp of the function's
  own measures it in the graph, as in ``fit``.

Every hook runs on the training thread and does a few stores and, at some steps'
ends, one read of the stamp's variable (about 40 us: :data:`READ_EVERY_S`); a hook
that fails switches the ``keras`` probe part off, never the job.

The pipelines' descriptions are :mod:`trainmedic.probe.tf_pipelines`', the
``tf.function`` steps :mod:`trainmedic.probe.tf_function_steps`'. What stays here (about
730 lines) installs Keras 3 and Keras 2 from one flavour table: its callbacks, phases,
saves and eager custom-loop hooks share one step stamp and one tracker.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainmedic.record.events import EventKind

if TYPE_CHECKING:
    from types import ModuleType

    from trainmedic.probe.parts import Part
    from trainmedic.probe.runtime import Probe
    from trainmedic.probe.steps import StepTracker

_get_ident = threading.get_ident

@dataclass(frozen=True)
class Flavour:
    """Where one Keras keeps what is hooked: each entry is (class path, method, what is
    lost without it); ``since`` is the first version that has them all."""

    module: str
    since: str
    callbacks: tuple[str, str]
    adapter: tuple[str, str, str]
    saves: tuple[tuple[str, str, str], ...]
    optimizers: tuple[tuple[str, str, str], ...]
    layer: tuple[str, str, str]

    def apis(self) -> list[tuple[str, str, str]]:
        return [(self.callbacks[0], "on_train_batch_end", self.callbacks[1]), self.adapter,
                *self.saves, *self.optimizers, self.layer]  # fmt: skip


KERAS3 = Flavour(
    module="keras",
    since="3.0",
    callbacks=("keras.src.callbacks.callback_list.CallbackList",
               "steps and phases of fit/evaluate"),
    adapter=("keras.src.trainers.data_adapters.data_adapter.DataAdapter", "get_tf_dataset",
             "the wait for data in fit"),
    saves=(("keras.src.callbacks.ModelCheckpoint", "_save_model",
            "ModelCheckpoint's saves as a phase"),
           ("keras.src.callbacks.BackupAndRestore", "_save_model",
            "BackupAndRestore's saves as a phase")),
    optimizers=(("keras.src.optimizers.base_optimizer.BaseOptimizer", "apply",
                 "steps of custom training loops"),),
    layer=("keras.src.layers.layer.Layer", "__call__",
           "the compute time of custom training loops"),
)  # fmt: skip
"""Keras 3 (``keras``; ``tf.keras`` from TensorFlow 2.16 on)."""

TF_KERAS = Flavour(
    module="tf_keras",
    since="2.15",
    callbacks=("tf_keras.src.callbacks.CallbackList", "steps and phases of fit/evaluate"),
    adapter=("tf_keras.src.engine.data_adapter.DataAdapter", "get_dataset",
             "the pipeline fit trains from"),
    saves=(("tf_keras.src.callbacks.ModelCheckpoint", "_save_model",
            "ModelCheckpoint's saves as a phase"),
           ("tf_keras.src.callbacks.BackupAndRestore", "_backup",
            "BackupAndRestore's saves as a phase")),
    optimizers=(("tf_keras.src.optimizers.optimizer.Optimizer", "apply_gradients",
                 "steps of custom training loops"),
                ("tf_keras.src.optimizers.legacy.optimizer_v2.OptimizerV2", "apply_gradients",
                 "steps of custom training loops with legacy optimizers")),
    layer=("tf_keras.src.engine.base_layer.Layer", "__call__",
           "the compute time of custom training loops"),
)  # fmt: skip
"""Keras 2 (``tf_keras``, what ``TF_USE_LEGACY_KERAS=1`` makes ``tf.keras``)."""


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
    traces (:func:`_install_traced_next` wraps it). There the wrapper adds, around the
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
        self.unread = 0
        """Steps since the variable was last read."""

    def _variable(self) -> Any:
        """``[total wait (s), steps]``."""
        if self._var is None:
            tf = self._tf
            # The class itself, not tf.Variable: tf.Variable goes through the variable
            # creators of a distribution strategy's scope, which would make a mirrored
            # variable (initialised by a broadcast across workers, updated on every
            # replica). This one is this process's own counter, never synchronised.
            plain = _resolve("tensorflow.python.ops.resource_variable_ops.ResourceVariable")
            with tf.init_scope(), tf.device("/CPU:0"):
                self._var = (plain or tf.Variable)(tf.zeros([2], tf.float64), trainable=False,
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
            # A strategy's batch is a PerReplica (a composite): its tensors are inside.
            flat = tf.nest.flatten(batch, expand_composites=True)
            tensors = [t for t in flat if isinstance(t, tf.Tensor)]
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

    def step_wait(self, step_s: float) -> float | None:
        """The wait of the step that just ended, ``step_s`` seconds long: read now when
        the step is long enough or enough steps went unread (class docstring), else the
        mean of the last read. ``None``: no step was stamped yet."""
        if not self.active:
            return None
        self.unread += 1
        if step_s >= READ_EVERY_S or self.unread >= READ_EVERY_STEPS or self.mean_wait is None:
            self.unread = 0
            wait = self.read()
            if wait is not None:
                return wait
        return self.mean_wait


def stamped_step(tracker: StepTracker, begin: float, now: float, wait: float | None) -> None:
    """A step from ``begin`` to ``now`` (the probe's clock, seconds) whose compiled call
    took its batch first, waiting ``wait`` seconds (``None``: not measured); the rest is
    compute. Ends the step."""
    start = begin
    if wait is not None:
        start = min(begin + wait, now)
        tracker.loader_enter(begin)
        tracker.loader_exit(start, None, True)
    tracker.compute_enter(start, "forward")
    tracker.compute_exit(now, "forward")
    tracker.api_step(now)


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
        self.per_call = 1
        """Steps a compiled call runs in the ``fit`` open (``steps_per_execution``)."""
        self.jit_compile: bool | None = None
        """Whether the model of the last ``fit`` compiles its step with XLA."""

    def mine(self) -> bool:
        """Whether the calling thread is the training thread (adopting it before any step)."""
        if not self.part.on:
            return False
        state = self.probe.state
        return _get_ident() == state.training_ident or self.probe.adopt_training_thread()

    def fit_begins(self, model: Any) -> None:
        """``fit`` begins: how many steps each of its compiled calls runs (Keras 3 keeps
        an int, Keras 2 a variable)."""
        spe: Any = getattr(model, "steps_per_execution", 1) if model is not None else 1
        with contextlib.suppress(AttributeError):
            spe = spe.numpy()
        try:
            self.per_call = max(1, int(spe))
        except (TypeError, ValueError):
            self.per_call = 1
        jit = getattr(model, "jit_compile", getattr(model, "_jit_compile", None))
        self.jit_compile = jit if isinstance(jit, bool) else None

    def batch_begin(self) -> None:
        self.begin = self.probe.clock()

    def batch_end(self) -> None:
        """A ``fit`` step ended: its wait for data from the stamp, its compute the rest."""
        probe = self.probe
        now = probe.clock()
        begin = self.begin if self.begin is not None else now
        self.begin = None
        spe = self.per_call
        stamp = self.stamp
        wait: float | None = None
        if spe > 1:
            if not self.multi_step_said:
                self.multi_step_said = True
                probe.emit(probe.event(
                    EventKind.PROBE_DEGRADED,
                    f"probe: Keras runs {spe} steps a call (steps_per_execution): steps are "
                    "counted, their wait for data is not measured",
                    keras_degraded_data(_keras_version(), [], ["data wait"]),
                ))  # fmt: skip
        elif stamp is not None:
            wait = stamp.step_wait(now - begin)
        stamped_step(self.tracker, begin, now, wait)
        functions = probe.tf_functions
        if functions is not None:
            functions.after_step()

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


def _keras_version(module: str = "keras") -> str:
    import sys

    found = sys.modules.get(module)
    return str(getattr(found, "__version__", "unknown"))


def install(keras: ModuleType, probe: Probe, flavour: Flavour = KERAS3) -> None:
    """Hook what this Keras offers (module docstring); what it lacks is said in one
    ``probe_degraded`` event, and the rest is still measured. Keras 3 and ``tf_keras``
    in one process share one :class:`KerasSteps`."""
    part = probe.parts["keras"]
    if not part.on:
        return
    part.check()
    version = _keras_version(flavour.module)
    found = {(path, method): _resolve(path) for path, method, _ in flavour.apis()}
    missing = [
        {"feature": f"{path.rsplit('.', 1)[-1]}.{method}", "api": path,
         "since": flavour.since, "part": "keras", "lost": lost}
        for path, method, lost in flavour.apis()
        if found[(path, method)] is None or not hasattr(found[(path, method)], method)
    ]  # fmt: skip
    if missing:
        probe.emit(probe.event(
            EventKind.PROBE_DEGRADED,
            f"probe: {flavour.module} {version} lacks "
            + ", ".join(m["api"] for m in missing) + ": " + "; ".join(m["lost"] for m in missing),
            keras_degraded_data(version, missing, [m["lost"] for m in missing]),
        ))  # fmt: skip

    def hooked(path: str, method: str) -> Any:
        cls = found.get((path, method))
        return cls if cls is not None and hasattr(cls, method) else None

    tf = _resolve("tensorflow")
    steps = probe.keras
    if steps is None:
        if flavour is KERAS3:
            backend = getattr(getattr(keras, "config", None), "backend", lambda: "")()
        else:
            backend = "tensorflow"
        stamp = ReadyStamp(tf) if tf is not None and backend == "tensorflow" else None
        steps = KerasSteps(probe, probe.ensure_tracker(), part, stamp)
        probe.keras = steps
    callbacks = hooked(flavour.callbacks[0], "on_train_batch_end")
    if callbacks is not None:
        _install_callbacks(callbacks, steps, probe)
    path, method, _ = flavour.adapter
    adapter = hooked(path, method)
    if adapter is not None and steps.stamp is not None:
        from trainmedic.probe.tf_pipelines import install_pipelines

        install_pipelines(adapter, method, part, probe)
    for path, method, _ in flavour.saves:
        cls = hooked(path, method)
        if cls is not None:
            _wrap_phase(cls, method, "checkpoint", steps, probe)
    if tf is not None:
        for path, method, _ in flavour.optimizers:
            cls = hooked(path, method)
            if cls is not None:
                _install_optimizer(cls, method, tf, steps, probe)
        path, method, _ = flavour.layer
        layer = hooked(path, method)
        if layer is not None:
            _install_compute(layer, method, "forward", tf, steps, probe)


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
            _guarded(steps, steps.batch_end)
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
                if entering:
                    _guarded(steps, lambda: steps.fit_begins(getattr(self, "model", None)))
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
    from trainmedic.probe import tf_pipelines

    seen = tf_pipelines.pipelines(probe)

    def epoch_begin(original: Any) -> Any:
        def wrapper(self: Any, epoch: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(epoch, int) and epoch >= 1 and not seen.repeat_said:
                _guarded(steps, lambda: seen.epoch_again(f"fit's epoch {epoch + 1}"))
            return original(self, epoch, *args, **kwargs)

        return wrapper

    if hasattr(cls, "on_epoch_begin"):
        _patch(cls, "on_epoch_begin", epoch_begin, probe)


def _subclasses(cls: type) -> Iterator[type]:
    sub: type
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


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


def _install_checkpoint_manager(probe: Probe) -> None:
    """``tf.train.CheckpointManager.save`` (custom loops' checkpoints) as the
    ``checkpoint`` phase, when the training thread calls it outside another phase
    (BackupAndRestore's save, already one, may call it inside)."""
    cls = _resolve("tensorflow.python.checkpoint.checkpoint_management.CheckpointManager")
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

    _patch(cls, "save", make, probe)


def _install_optimizer(cls: Any, method: str, tf: Any, steps: KerasSteps, probe: Probe) -> None:
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

    _patch(cls, method, make, probe)


def _install_compute(
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

    _patch(owned, "__next__", make, probe)
    tf_function_steps.install_traced_next(tf, functions, probe)
    _install_checkpoint_manager(probe)
    tape = _resolve("tensorflow.python.eager.backprop.GradientTape")
    if tape is not None:
        _install_compute(tape, "gradient", "backward", tf, None, probe, functions.traced)
    if not tf_function_steps.install_functions(tf, functions, probe):
        probe.emit(probe.event(
            EventKind.PROBE_DEGRADED,
            "probe: TensorFlow's tf.function class is not where the probe looks: the steps "
            "of custom loops whose step is a tf.function are not seen",
            keras_degraded_data(str(getattr(tf, "__version__", "unknown")), [], ["steps"]),
        ))  # fmt: skip
    dataset_cls = _resolve("tensorflow.python.data.ops.dataset_ops.DatasetV2")
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

        _patch(dataset_cls, "__iter__", make_iter, probe)
