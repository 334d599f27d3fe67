"""The wait for data of a compiled TensorFlow step, as the step itself measures it
(:class:`ReadyStamp`: seconds, stamped in the graph around the iterator's ``get_next``),
and a stamped step handed to the step tracker. Used by ``fit``'s steps
(:mod:`trainmedic.probe.keras_hooks`) and by ``tf.function`` steps
(:mod:`trainmedic.probe.tf_function_steps`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainmedic.probe.keras_apis import resolve

if TYPE_CHECKING:
    from trainmedic.probe.steps import StepTracker


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
    traces (:func:`~trainmedic.probe.tf_function_steps.install_traced_next` wraps it).
    There the wrapper adds, around the graph's own ``get_next``, a ``tf.timestamp()``
    before it, one after the batch (with a control dependency on the batch), and adds
    their difference and one step to the variable's totals. They run inside the step's
    graph at every step: a few microseconds, no Python, no change to the pipeline or its
    elements.

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
            plain = resolve("tensorflow.python.ops.resource_variable_ops.ResourceVariable")
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
