"""Custom TensorFlow loops whose training step is a ``tf.function``: each eager call a
step, its wait for data stamped inside the graph when the batch is taken there.

A function whose trace takes a gradient or applies an optimizer trains
(:class:`FunctionSteps`); its later eager calls on the training thread are steps, their
compute the call less the wait for a batch taken inside it (``next(iterator)`` traced
into the function), which a :class:`~trainmedic.probe.tf_ready_stamp.ReadyStamp` of the
function's own measures, as in ``fit``. Installed by :mod:`trainmedic.probe.tf_custom_loops`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainmedic.probe.keras_apis import patch, resolve
from trainmedic.probe.tf_facts import AT_STEPS
from trainmedic.probe.tf_ready_stamp import ReadyStamp, stamped_step
from trainmedic.record.events import EventKind

if TYPE_CHECKING:
    from trainmedic.probe.parts import Part
    from trainmedic.probe.runtime import Probe
    from trainmedic.probe.steps import StepTracker

_get_ident = threading.get_ident


ITERATORS = (
    ("tensorflow.python.data.ops.iterator_ops.OwnedIterator", ("get_next",)),
    ("tensorflow.python.distribute.input_lib._SingleWorkerDatasetIteratorBase",
     ("get_next_as_list", "get_next_as_optional_list")),
)  # fmt: skip
"""The iterators whose batch a compiled step traces, and the methods that take it: a
plain pipeline's, and each input worker's of a distribution strategy. A strategy's own
iterator (:data:`STRATEGY_ITERATOR`) is stamped only where the per-worker one is not
found: its ``get_next`` also counts, across workers, the replicas that still have data
(a collective), so around it every worker would wait as long as the slowest one."""
STRATEGY_ITERATOR = ("tensorflow.python.distribute.input_lib.DistributedIteratorBase",
                     ("get_next",))  # fmt: skip


class FunctionSteps:
    """Custom loops whose step is a ``tf.function`` (module docstring).

    A function's first call traces it; while it traces, the tape's ``gradient`` and the
    optimizer's ``apply`` (their traced calls) say that it trains (:meth:`traced`). Its
    later calls are steps: the call's time is the step's compute, less the wait for a
    batch taken inside it, which a :class:`ReadyStamp` of its own measures.
    """

    def __init__(self, probe: Probe, tracker: StepTracker, part: Part, tf: Any) -> None:
        self.probe = probe
        self.tracker = tracker
        self.part = part
        self.tf = tf
        self.trains = False
        """A gradient or an optimizer's apply was traced since the outermost call began."""
        self.training: set[int] = set()
        """``id`` of each function known to train (functions live as long as the job's loop)."""
        self.stamps: dict[int, ReadyStamp] = {}
        self.local = threading.local()
        """``stamp``: the stamp of the function this thread is calling (tracing) now;
        ``depth``: stamped iterator calls open (a strategy's nest its workers')."""
        self.facts_next = 0
        """Index in :data:`~trainmedic.probe.tf_facts.AT_STEPS` of the next reading."""

    def after_step(self) -> None:
        """A training step ended: at the step counts of
        :data:`~trainmedic.probe.tf_facts.AT_STEPS`, the job's GPU settings and memory
        are read and sent (a ``tf_gpu`` event); a job on no GPU is read once."""
        at = self.facts_next
        if at >= len(AT_STEPS) or self.tracker.train_steps < AT_STEPS[at]:
            return
        n = self.tracker.train_steps
        while at < len(AT_STEPS) and n >= AT_STEPS[at]:
            at += 1
        self.facts_next = at
        self.send_facts()

    def send_facts(self) -> None:
        import sys

        from trainmedic.probe.tf_facts import read

        keras = self.probe.keras
        facts = read(self.tf, dict(sys.modules), keras.jit_compile if keras else None)
        if facts is None:
            self.facts_next = len(AT_STEPS)
            return
        growth = [g.get("memory_growth") for g in facts["gpus"]]
        peak = max((g.get("peak_bytes", 0) for g in facts["gpus"]), default=0)
        probe = self.probe
        probe.emit(probe.event(
            EventKind.TF_GPU,
            f"TensorFlow on {len(growth)} GPU(s): memory growth {growth}, pool peak "
            f"{peak / 2**30:.2f} GiB, dtype policy {facts['dtype_policy']}, "
            f"jit_compile {facts['jit_compile']}",
            facts,
        ))  # fmt: skip

    def traced(self) -> None:
        """A gradient or an optimizer step is being traced into a function."""
        self.trains = True

    def tracing_stamp(self) -> ReadyStamp | None:
        """The stamp of the outermost function the calling thread is in, if any."""
        return getattr(self.local, "stamp", None)

    def traced_batch(self, call: Callable[[], Any]) -> Any:
        """A batch taken inside a compiled step being traced, by ``call()``: stamped with
        fit's stamp inside ``fit``, else with the function's own; only the outermost
        call (a strategy's iterator calls its workers' inside)."""
        keras = self.probe.keras
        stamp = keras.stamp if keras is not None and keras.in_fit else self.tracing_stamp()
        n = getattr(self.local, "depth", 0)
        if n or stamp is None or not self.part.on:
            return call()
        self.local.depth = n + 1
        try:
            return stamp.around(call, self.part.fail)
        finally:
            self.local.depth = n

    def call(self, function: Any, original: Callable[[], Any]) -> Any:
        """An eager call of ``function`` on the training thread, made by ``original()``."""
        key = id(function)
        stamp = self.stamps.get(key)
        if stamp is None:
            stamp = self.stamps[key] = ReadyStamp(self.tf)
        self.trains = False
        self.local.stamp = stamp
        clock = self.probe.clock
        begin = clock()
        try:
            result = original()
        finally:
            self.local.stamp = None
        try:
            if self.trains:
                self.trains = False
                self.training.add(key)
            if key in self.training:
                now = clock()
                stamped_step(self.tracker, begin, now, stamp.step_wait(now - begin))
                self.after_step()
        except Exception as exc:
            self.part.fail(exc)
        return result


def function_steps(probe: Probe, tf: Any) -> FunctionSteps:
    """The probe's :class:`FunctionSteps` (one per process)."""
    found = probe.tf_functions
    if found is None:
        found = FunctionSteps(probe, probe.ensure_tracker(), probe.parts["keras"], tf)
        probe.tf_functions = found
    return found


def install_functions(tf: Any, functions: FunctionSteps, probe: Probe) -> bool:
    """Every ``tf.function``'s eager call, for :class:`FunctionSteps`. Returns whether
    TensorFlow's function class was found."""
    cls = resolve("tensorflow.python.eager.polymorphic_function.polymorphic_function.Function")
    if not isinstance(cls, type) or "__call__" not in cls.__dict__:
        return False
    part = functions.part
    state = probe.state
    eagerly = tf.executing_eagerly

    def make(original: Any) -> Any:
        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            keras = probe.keras
            if (
                not part.on
                or _get_ident() != state.training_ident
                or (keras is not None and keras.in_fit)
                or functions.tracing_stamp() is not None
                or not eagerly()
            ):
                return original(self, *args, **kwargs)
            return functions.call(self, lambda: original(self, *args, **kwargs))

        return __call__

    patch(cls, "__call__", make, probe)
    return True


def install_traced_next(tf: Any, functions: FunctionSteps, probe: Probe) -> None:
    """The iterators' ``get_next`` traced into a compiled step:
    :meth:`FunctionSteps.traced_batch`. An eager call is left alone."""
    eagerly = tf.executing_eagerly

    def make(original: Any) -> Any:
        def taken(self: Any, *args: Any, **kwargs: Any) -> Any:
            if eagerly():
                return original(self, *args, **kwargs)
            return functions.traced_batch(lambda: original(self, *args, **kwargs))

        return taken

    worker_found = False
    for path, methods in ITERATORS:
        cls = resolve(path)
        for method in methods:
            if cls is not None and method in cls.__dict__:
                patch(cls, method, make, probe)
                worker_found = worker_found or "SingleWorker" in path
    if not worker_found:
        path, methods = STRATEGY_ITERATOR
        cls = resolve(path)
        if cls is not None and "get_next" in cls.__dict__:
            patch(cls, "get_next", make, probe)
