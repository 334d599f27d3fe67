"""Outermost module calls, timed without a Python frame for every nested module call.

A forward pass of a deep model is hundreds of module calls, and only the
outermost one (the model, the loss module) matters to the step tracker. The
ways to see it, measured on this project's 2-core machine with a 68-call
network (``benchmarks/forward_hooks.py``, docs/performance.md):

* a wrapper around ``nn.Module.__call__`` sees every call, nested ones
  included, and returns at once for those: +0.16 µs per module call;
* torch's global forward pre/post hooks return at once when nested too, but
  any global hook sends *every* module call down the slow path of
  ``_call_impl``: +1.3 µs per module call;
* per-instance hooks, an instance ``forward`` attribute or a wrapper on the
  root's class cost only the root's call (+1-4 µs per step, whatever the
  depth). Instance hooks and attributes are pickled with the model
  (``torch.save(model)`` would fail on them) and instance hooks stop
  ``torch.jit.script``; a class attribute is neither pickled nor copied.

So the probe *discovers* the classes of outermost calls with the first
wrapper, then keeps the same wrapper on those classes only:

1. Discovery: the wrapper sits on ``nn.Module.__call__`` and records the class
   of every outermost call on the training thread.
2. After :data:`DISCOVERY_STEPS` steps (or :data:`DISCOVERY_CALLS` outermost
   calls when no step ends: an inference loop), it is removed and each class
   seen gets the wrapper as its own ``__call__``. Nested modules never pass
   through the probe again - except nested instances of a root's own class
   (a ``Sequential`` of ``Sequential`` blocks), which return at once.
3. Discovery runs again, at a step end or a DataLoader fetch (never inside a
   module call), when the probe's thread asks for it: steps ended with no
   forward call seen (a model of another class took over), train steps
   stopped while the job keeps working (an evaluation loop, perhaps of another
   model), or routinely (:data:`REDISCOVER_S`); at most once per :data:`MIN_GAP_S`.
   The training thread itself only tests two flags per step. Routine discoveries
   come further apart while they find nothing new; the probe's thread asks for
   one on "no forward seen" only for steps that ran with the compute hooks on.

Every discovery changes ``nn.Module`` twice and every window of the compute
hooks (:mod:`trainmedic.probe.detail`) a root class twice; from Python 3.13 the
changes are held to :data:`TYPE_CHANGE_BUDGET` per class.

A class wrapper calls the class's own ``__call__`` when it has one (its own or
inherited from a class between it and ``nn.Module``), else whatever
``nn.Module.__call__`` is at that moment, so tools that patch it for a while
(``torch.fx`` tracing) still see every call. Removal puts back only what is
still the probe's.

Under ``torch.compile`` a discovery must not make dynamo recompile: its guards
check what it read while tracing, and a read through a wrapper (its closure,
``nn.Module.__call__`` of the moment) fails once the watch swaps that wrapper in
or out. So a wrapper tests ``is_compiling()`` before
anything else (dynamo compiles the wrapper's own frame where ``torch.compile
(model)`` kept the ``model.__call__`` of its making: a depth read there is a
guard too), then calls the class's own ``__call__`` or ``nn.Module.__call__`` as
the watch found it, never the generic wrapper. And each wrapper carries
dynamo's mark of a wrapper (``_torchdynamo_inline``, as ``torch.compile`` and
``torch.jit.script`` set it): where dynamo resolves a module's ``__call__`` to
it, it traces that target instead, and nothing of the wrapper is guarded.
Code calling a model compiles as often as without the probe, across
discoveries (``tests/probe/test_compiled.py``). The price: while discovering,
a nested call in a process that imported dynamo runs ``is_compiling()`` too
(about 19 more bytecodes; 4 without dynamo).
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainmedic.probe.hookutil import autocast_readers, batch_size, compiling_reader

if TYPE_CHECKING:
    from trainmedic.probe.seams import ProbeSeam
    from trainmedic.probe.steps import StepTracker

DISCOVERY_STEPS = 3
"""Steps ended while discovering before the classes seen are patched."""
DISCOVERY_CALLS = 64
"""... or outermost calls seen while discovering, when steps do not end."""
REDISCOVER_S = 30.0
"""Seconds from a discovery that found a new class to the next routine one (a model
that only appears now and then); each routine discovery that finds nothing new
doubles the wait, up to :data:`REDISCOVER_MAX_S`."""
REDISCOVER_MAX_S = 1800.0
TYPE_CHANGE_BUDGET: int | None = 400 if sys.version_info >= (3, 13) else None
"""Changes of a class the watch makes at most, counting those of its bases (Python 3.13
and later; ``None``: no limit). From 3.13 CPython gives a class at most 1,000
attribute-cache version tags, a new one after each change of the class or of a
base (``MAX_VERSIONS_PER_CLASS``); past that, lookups on its instances are never
cached or specialised again: a call of a class changed 1,200 times took 2.2 times
as long (``benchmarks/type_versions.py``). Each discovery changes ``nn.Module``
twice and each window's switch a root class twice, so within the budget the
watch switches as before; past it a root class keeps its wrapper, which then
passes calls through while the hooks are off, and discoveries stop (the classes
found stay watched). The rest of the 1,000 is left to the job and other tools."""
DISCOVERY_RESERVE = 100
"""Of :data:`TYPE_CHANGE_BUDGET`, the changes the windows leave to discoveries: 50
discoveries, which the routine back-off spreads over about a day."""
MIN_GAP_S = 2.0
"""Seconds after a discovery before another may begin."""

_get_ident = threading.get_ident


class ForwardWatch:
    """Times outermost module calls on the training thread; see the module doc.

    Every method runs on the training thread except :meth:`request`.
    """

    def __init__(self, torch: Any, probe: ProbeSeam, tracker: StepTracker) -> None:
        self.module_cls: type = torch.nn.Module
        self._base = self.module_cls.__dict__["__call__"]
        self._probe = probe
        self._tracker = tracker
        self._tensor = torch.Tensor
        self._is_compiling = compiling_reader(torch)
        self._autocast = autocast_readers(torch)
        self._is_grad_enabled = torch.is_grad_enabled
        self.seen: set[type] = set()
        self.patched: dict[type, tuple[Callable[..., Any], Any]] = {}
        """Patched class -> (the probe's wrapper, the class's own ``__call__`` or ``None``)."""
        self._installed = False
        self.suspended = False
        """The class wrappers are taken off (:meth:`suspend`, :mod:`trainmedic.probe.detail`)."""
        self.discovering = False
        self.discoveries = 0
        self.requested = False
        self.pending = False
        """``discovering or requested``: the one flag the hot paths test."""
        self._steps = 0
        self._forwards_at_begin = 0
        self._ended_at = float("-inf")
        self.next_routine = float("inf")
        """When the next routine discovery is due (probe clock)."""
        self._routine_s = REDISCOVER_S
        self.type_change_budget = TYPE_CHANGE_BUDGET
        self.discovery_reserve = DISCOVERY_RESERVE
        self.changes: dict[type, int] = {}
        """Changes the watch made to each class (see :data:`TYPE_CHANGE_BUDGET`)."""
        self.exhausted = False
        """Discoveries stopped: another would have passed the change budget of ``nn.Module``."""
        self._generic = self._wrapper(self._base, record=True)

    # --- lifecycle ------------------------------------------------------------------------

    def install(self) -> None:
        self._installed = True
        self._probe.forward = self
        self.begin(self._probe.clock())

    def uninstall(self) -> None:
        """Remove every wrapper that is still the probe's."""
        self._installed = False
        if self._probe.forward is self:
            self._probe.forward = None
        self._set_generic(False)
        for cls, (wrapper, own) in self.patched.items():
            if cls.__dict__.get("__call__") is wrapper:
                if own is None:
                    delattr(cls, "__call__")
                else:
                    cls.__call__ = own  # type: ignore[method-assign]
        self.patched.clear()
        self.discovering = False
        self.pending = self.requested = False

    def suspend(self) -> None:
        """Take the class wrappers off for a while (never while discovering); a wrapper
        whose class may not be changed twice more stays, and passes calls through."""
        if self.discovering:
            return
        self.suspended = True
        for cls, (wrapper, own) in list(self.patched.items()):
            if cls.__dict__.get("__call__") is wrapper and self.may_change(
                cls, 2 + self.discovery_reserve
            ):
                self._changed(cls)
                if own is None:
                    delattr(cls, "__call__")
                else:
                    cls.__call__ = own  # type: ignore[method-assign]

    def resume(self) -> None:
        """Put the class wrappers back where nobody else changed ``__call__`` meanwhile."""
        self.suspended = False
        if not self._installed:
            return
        for cls, (wrapper, own) in list(self.patched.items()):
            if cls.__dict__.get("__call__") is own:
                self._changed(cls)  # suspend() kept this change within the budget
                cls.__call__ = wrapper  # type: ignore[method-assign]

    # --- the change budget (TYPE_CHANGE_BUDGET) ---------------------------------------------

    def may_change(self, cls: type, times: int = 1) -> bool:
        """Whether the watch may change ``cls`` ``times`` more times: every class it
        patched that ``cls`` is a base of stays within the budget too."""
        budget = self.type_change_budget
        if budget is None:
            return True
        changes = self.changes
        for c in (cls, *(p for p in self.patched if p is not cls and issubclass(p, cls))):
            if sum(changes.get(base, 0) for base in c.__mro__) + times > budget:
                return False
        return True

    def _changed(self, cls: type) -> None:
        self.changes[cls] = self.changes.get(cls, 0) + 1

    def begin(self, now: float) -> None:
        """Start discovering (at a point outside any module call)."""
        self._tracker.gap = None  # steps end the general way, which counts them here
        self.requested = False
        if self.discovering or not self._installed or self.exhausted:
            self.pending = self.discovering
            return
        if not self.may_change(self.module_cls, 2):
            self.exhausted = True
            self.pending = False
            self.next_routine = float("inf")
            return
        if self.suspended:
            self.resume()  # a discovery sees the classes already known through their wrappers
        self.discovering = True
        self.pending = True
        self.discoveries += 1
        self._steps = 0
        self._forwards_at_begin = self._tracker.forwards
        self._set_generic(True)

    def end(self, now: float) -> None:
        """Stop discovering: patch the classes seen, remove the generic wrapper."""
        if not self.discovering:
            return
        self.discovering = False
        self.pending = self.requested
        self._ended_at = now
        known = len(self.patched)
        # Parents first: a subclass of a patched class is already covered.
        for cls in sorted(self.seen - self.patched.keys(), key=lambda c: len(c.__mro__)):
            if not any(issubclass(cls, done) for done in self.patched):
                self._patch(cls)
        self.seen.clear()
        self._set_generic(False)
        # A discovery that found nothing new makes the next routine one wait longer.
        found = len(self.patched) > known
        self._routine_s = REDISCOVER_S if found else min(2 * self._routine_s, REDISCOVER_MAX_S)
        self.next_routine = now + self._routine_s

    def request(self) -> None:
        """Ask for a discovery at the next safe point (any thread)."""
        self.requested = True
        self.pending = True
        self._tracker.gap = None  # steps end the general way, which acts on it

    # --- safe points (training thread, outside module calls) -------------------------------

    def step_closed(self, now: float) -> None:
        """A step ended while discovering or with a discovery asked for (the probe
        calls this only then): count the step, or begin."""
        if self.discovering:
            self._steps += 1
            if self._steps >= DISCOVERY_STEPS:
                self.end(now)
        elif self.requested and now - self._ended_at >= MIN_GAP_S:
            self.begin(now)

    def fetched(self, now: float) -> None:
        """A DataLoader batch is about to be fetched: act on a pending request, or end
        a discovery that has seen enough calls (an evaluation loop ends no steps)."""
        if self.discovering:
            if self._tracker.forwards - self._forwards_at_begin >= DISCOVERY_CALLS:
                self.end(now)
        elif self.requested and now - self._ended_at >= MIN_GAP_S:
            self.begin(now)

    # --- the wrappers ------------------------------------------------------------------------

    def _set_generic(self, on: bool) -> None:
        cls = self.module_cls
        current = cls.__dict__.get("__call__")
        if on and current is self._base:
            self._changed(cls)
            cls.__call__ = self._generic  # type: ignore[method-assign]
        elif not on and current is self._generic:
            self._changed(cls)
            cls.__call__ = self._base  # type: ignore[method-assign]

    def _patch(self, cls: type) -> None:
        own = cls.__dict__.get("__call__")
        inherited = next(c.__dict__["__call__"] for c in cls.__mro__ if "__call__" in c.__dict__)
        # The class's own ``__call__``, one inherited from a class between it and
        # ``nn.Module``, or (``None``) whatever ``nn.Module.__call__`` is at the call.
        target = inherited if inherited not in (self._base, self._generic) else None
        if not self.may_change(cls):
            return  # changed too often already: it stays unwatched
        wrapper = self._wrapper(target, record=False)
        try:
            cls.__call__ = wrapper  # type: ignore[method-assign]
        except (TypeError, AttributeError):
            return  # a class that refuses attributes stays unwatched
        self._changed(cls)
        self.patched[cls] = (wrapper, own)

    def _wrapper(self, original: Any, record: bool) -> Callable[..., Any]:
        """The wrapper of outermost calls.

        ``original`` is what it calls; ``None`` means whatever ``nn.Module.__call__``
        is now (while dynamo traces: the one the watch found). ``record`` (the generic
        wrapper) notes the class of each outermost call and ends discovery after
        :data:`DISCOVERY_CALLS` outermost calls.
        """
        probe = self._probe
        part = probe.parts["forward"]
        tracker = self._tracker
        clock = probe.clock
        state = probe.state
        module_cls = self.module_cls
        tensor = self._tensor
        is_compiling = self._is_compiling
        is_grad_enabled = self._is_grad_enabled
        autocast_cuda, autocast_cpu = self._autocast
        modules = sys.modules
        seen = self.seen
        watch = self
        fixed = original
        # What dynamo traces: ``nn.Module.__call__`` as the watch found it, never the
        # one of the moment (the generic wrapper, while discovering).
        traced = original if original is not None else self._base

        def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
            # The tracing test before the depth (module doc, "Under torch.compile"):
            # dynamo folds ``is_compiling()`` to a constant, where the depth would be a
            # guard and the thread test or the clock would break its graph. Before
            # dynamo is loaded nothing can be compiling: a dictionary test only.
            if "torch._dynamo" in modules and is_compiling():
                return traced(self, *args, **kwargs)
            call = fixed or module_cls.__call__
            if state.depth or _get_ident() != state.training_ident or not part.on:
                return call(self, *args, **kwargs)
            if watch.suspended:  # kept on past its change budget: the hooks are off
                return call(self, *args, **kwargs)
            try:
                if part.fault:
                    part.check()
                if record:
                    seen.add(type(self))
                grad = is_grad_enabled()
                if tracker.wants_batch:
                    if args and isinstance(args[0], tensor):  # ``model(x)``, without a call
                        shape = args[0].shape
                        samples = shape[0] if shape else None
                    else:
                        samples = batch_size(args, tensor) if args else batch_size(kwargs, tensor)
                    on = autocast_cuda() or autocast_cpu()
                    tracker.forward_enter(clock(), samples, grad, None if on is None else bool(on))
                else:
                    tracker.forward_enter(clock(), None, grad, None)
            except Exception as exc:
                part.fail(exc)
                tracker.compute_exit(clock(), "forward")
                return call(self, *args, **kwargs)
            state.depth = 1
            try:
                return call(self, *args, **kwargs)
            finally:
                state.depth = 0
                try:
                    tracker.forward_exit(clock(), grad)
                    if record and tracker.forwards - watch._forwards_at_begin >= DISCOVERY_CALLS:
                        watch.end(clock())
                except Exception as exc:
                    part.fail(exc)

        functools.update_wrapper(__call__, traced)
        # Dynamo's own mark of a wrapper (``torch.compile``'s, ``torch.jit.script``'s):
        # where it resolves a module's ``__call__`` to this function, it traces
        # ``traced`` instead, so no guard of the compiled code is on this wrapper.
        __call__._torchdynamo_inline = traced  # type: ignore[attr-defined]
        return __call__


def install(torch: Any, probe: ProbeSeam, tracker: StepTracker) -> ForwardWatch:
    """Start watching outermost module calls (discovering first) as ``probe.forward``;
    undone by ``probe.restore``."""
    watch = ForwardWatch(torch, probe, tracker)
    watch.install()
    probe.restore.append(watch.uninstall)
    return watch
