"""Keras and TensorFlow jobs: steps, the wait for data, and phases, with no code change.

Installed when the job imports ``keras`` (Keras 3; ``tf.keras`` is Keras 3 from
TensorFlow 2.16 on) and ``tensorflow``; nothing here imports either first.

* **``fit``**: Keras runs each step in one compiled function that takes its batch
  from the ``tf.data`` iterator *inside* the graph, so no Python call brackets the
  wait for data. The callbacks' ``on_train_batch_begin``/``on_train_batch_end``
  (:class:`CallbackList`, wrapped once for every model) bracket the step; the wait
  is measured inside the compiled step, around the iterator's ``get_next`` that
  Keras traces into it
  (:class:`~trainmedic.probe.tf_ready_stamp.ReadyStamp`), and read at the step's end; the
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
  optimizer's ``apply`` ends the step (:mod:`trainmedic.probe.tf_custom_loops`).
  Inside ``fit`` the callbacks mark the steps instead.
* **Custom loops whose step is a ``tf.function``**: a function whose trace takes a
  gradient or applies an optimizer is a training step
  (:mod:`trainmedic.probe.tf_function_steps`); each
  eager call of it is one step, its compute the call. The batch is waited for
  either before the call (an eagerly iterated pipeline: ``__next__``) or inside it
  (``next(iterator)`` traced into the function): then a stamp of the function's
  own measures it in the graph, as in ``fit``.

Every hook runs on the training thread and does a few stores and, at some steps'
ends, one read of the stamp's variable (about 40 us:
:data:`~trainmedic.probe.tf_ready_stamp.READ_EVERY_S`); a hook
that fails switches the ``keras`` probe part off, never the job.

The pipelines' descriptions are :mod:`trainmedic.probe.tf_pipelines`', the stamp
:mod:`trainmedic.probe.tf_ready_stamp`', the eager custom loops'
:mod:`trainmedic.probe.tf_custom_loops`' (:func:`install_tensorflow`, which the probe
calls from here), the ``tf.function`` steps :mod:`trainmedic.probe.tf_function_steps`', where
and how a class is found and wrapped :mod:`trainmedic.probe.keras_apis`'. What stays here
installs Keras 3 and Keras 2 from one flavour table: fit's callbacks and phases and the
saves, with the custom loops' optimizer and layer hooks, sharing one stamp and tracker.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainmedic.probe.keras_apis import keras_degraded_data, keras_version, patch, resolve
from trainmedic.probe.tf_custom_loops import install_compute, install_optimizer
from trainmedic.probe.tf_custom_loops import (
    install_tensorflow as install_tensorflow,  # the probe installs TensorFlow's hooks from here
)
from trainmedic.probe.tf_ready_stamp import ReadyStamp, stamped_step
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
                    keras_degraded_data(keras_version(), [], ["data wait"]),
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


def install(keras: ModuleType, probe: Probe, flavour: Flavour = KERAS3) -> None:
    """Hook what this Keras offers (module docstring); what it lacks is said in one
    ``probe_degraded`` event, and the rest is still measured. Keras 3 and ``tf_keras``
    in one process share one :class:`KerasSteps`."""
    part = probe.parts["keras"]
    if not part.on:
        return
    part.check()
    version = keras_version(flavour.module)
    found = {(path, method): resolve(path) for path, method, _ in flavour.apis()}
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

    tf = resolve("tensorflow")
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
                install_optimizer(cls, method, tf, steps, probe)
        path, method, _ = flavour.layer
        layer = hooked(path, method)
        if layer is not None:
            install_compute(layer, method, "forward", tf, steps, probe)


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

    patch(cls, "on_train_batch_begin", batch_begin, probe)
    patch(cls, "on_train_batch_end", batch_end, probe)
    patch(cls, "on_test_begin", phase("eval"), probe)
    patch(cls, "on_test_end", phase(None), probe)
    patch(cls, "on_predict_begin", phase("predict"), probe)
    patch(cls, "on_predict_end", phase(None), probe)
    patch(cls, "on_train_begin", fit(True), probe)
    patch(cls, "on_train_end", fit(False), probe)
    from trainmedic.probe import tf_pipelines

    seen = tf_pipelines.pipelines(probe)

    def epoch_begin(original: Any) -> Any:
        def wrapper(self: Any, epoch: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(epoch, int) and epoch >= 1 and not seen.repeat_said:
                _guarded(steps, lambda: seen.epoch_again(f"fit's epoch {epoch + 1}"))
            return original(self, epoch, *args, **kwargs)

        return wrapper

    if hasattr(cls, "on_epoch_begin"):
        patch(cls, "on_epoch_begin", epoch_begin, probe)


def _wrap_phase(cls: Any, name: str, phase: str, steps: KerasSteps, probe: Probe) -> None:
    def make(original: Any) -> Any:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            _guarded(steps, lambda: steps.phase(phase))
            try:
                return original(self, *args, **kwargs)
            finally:
                _guarded(steps, lambda: steps.phase(None))

        return wrapper

    patch(cls, name, make, probe)
