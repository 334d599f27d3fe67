"""The probe's hooks into torch, installed right after the job imports torch.

* Optimizer steps: torch's global ``register_optimizer_step_pre_hook`` /
  ``register_optimizer_step_post_hook``.
* Outermost module calls: a wrapper on the ``__call__`` of the classes whose
  instances are called outermost, found by a short discovery with a wrapper
  on ``torch.nn.Module.__call__`` (:mod:`trainmedic.probe.forward`): nested
  module calls do not pass through the probe.
* Backward calls: a wrapper around ``torch.autograd.backward``, which
  ``Tensor.backward`` calls.
* DataLoaders: wrappers around ``_BaseDataLoaderIter.__next__`` (time blocked
  and the batch's size), ``DataLoader.__iter__`` (the loader's settings, once
  per loader), the worker loop (marks the process as a DataLoader worker and
  samples its stack) and the pin-memory loop (registers that thread).

Every wrapper calls the original outside its own ``try`` blocks, so the job's
exceptions and ``StopIteration`` pass through untouched; the probe's own
errors disable the failing part (:mod:`trainmedic.probe.parts`). Under
``torch.compile`` tracing the wrappers and the optimizer hooks step aside, so
they never cause graph breaks; an optimizer step compiled into a graph is
told to the step tracker while dynamo traces it
(:meth:`~trainmedic.probe.steps.StepTracker.optimizer_compiled`). Only the
training thread's calls are timed.
"""

from __future__ import annotations

import functools
import importlib
import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any

from trainmedic.probe import forward
from trainmedic.probe.detail import DetailHook
from trainmedic.probe.hookutil import batch_size, dynamo_reader, run_while_tracing
from trainmedic.probe.importhook import when_imported
from trainmedic.probe.steps import NO_FETCH_LIMIT

if TYPE_CHECKING:
    from collections.abc import Callable

    from trainmedic.probe.seams import ProbeSeam
    from trainmedic.probe.steps import StepTracker

_get_ident = threading.get_ident


def install(
    torch: Any, probe: ProbeSeam, tracker: StepTracker, missing: frozenset[str] = frozenset()
) -> list[str]:
    """Install every hook whose part is on; returns the names of those installed.

    ``missing``: the features this torch lacks (:func:`trainmedic.probe.torch_features.find_gaps`),
    whose hooks are left out.
    """
    installed: list[str] = []
    steps = probe.parts["steps"]
    for name, installer in (
        ("steps", _install_optimizer_hooks),
        ("forward", _install_forward),
        ("backward", _install_backward),
        ("loader", _install_loader),
    ):
        part = probe.parts[name]
        if not part.on or (name != "loader" and not steps.on):
            continue
        if name == "steps" and "optimizer_step_hooks" in missing:
            continue  # steps end at backward calls instead (the tracker's backward mode)
        try:
            installer(torch, probe, tracker, missing)
            installed.append(name)
        except Exception as exc:
            part.fail(exc)
    from trainmedic.probe.graphs import install_step_extras  # GradScaler, CUDA graphs

    return installed + install_step_extras(torch, probe, tracker, missing)


def uninstall(probe: ProbeSeam) -> None:
    """Put torch back as it was (hooks removed, originals restored), newest first."""
    detail, probe.detail = probe.detail, None
    if detail is not None:  # nothing left to switch
        detail.enabled = False
        detail.hooks.clear()
        detail.tracker.set_detail(True, False)
        detail.tracker.fetch_limit = NO_FETCH_LIMIT
    while probe.restore:
        probe.restore.pop()()


# --- optimizer steps ----------------------------------------------------------------------


def _install_optimizer_hooks(
    torch: Any, probe: ProbeSeam, tracker: StepTracker, missing: frozenset[str]
) -> None:
    # ``torch.optim`` deletes its ``optimizer`` attribute; the module is still there.
    optimizer_mod = importlib.import_module("torch.optim.optimizer")
    part = probe.parts["steps"]
    clock = probe.clock
    state = probe.state
    is_compiling = dynamo_reader(torch)
    modules = sys.modules

    # ``is_compiling()`` first, as in the forward wrapper (trainmedic.probe.forward):
    # dynamo folds it to a constant when it traces a compiled region that calls
    # ``optimizer.step()``, where the thread test or the clock would break its graph
    # (and fail a ``fullgraph=True`` compile), and reading the probe's state would
    # add guards on it. The hooks are then absent from the compiled code. Dynamo's
    # own test (dynamo_reader): one frame a step, not two.

    def pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        if (
            ("torch._dynamo" in modules and is_compiling())
            or not part.on
            or _get_ident() != state.training_ident
        ):
            return
        try:
            if part.fault:
                part.check()
            tracker.optimizer_enter(clock())
        except Exception as exc:
            part.fail(exc)

    @run_while_tracing
    def step_compiled(optimizer: Any) -> None:
        # While dynamo traces the post hook (see run_while_tracing): this step ends
        # now, and the optimizer's next ones, compiled, end at backward calls.
        if not part.on or _get_ident() != state.training_ident:
            return
        try:
            tracker.optimizer_compiled(clock(), id(optimizer))
        except Exception as exc:
            part.fail(exc)

    def post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        if "torch._dynamo" in modules and is_compiling():
            step_compiled(optimizer)
            return
        if not part.on:
            return
        try:
            if _get_ident() != state.training_ident and not probe.adopt_training_thread():
                return
            now = clock()
            gap = tracker.gap
            # A gap step closes in the gap's own close (StepTracker.optimizer_exit's
            # first test, a call less on most short steps).
            if gap is None or not gap.close(tracker, now, id(optimizer)):
                tracker.optimizer_exit(now, id(optimizer))
        except Exception as exc:
            part.fail(exc)

    # The pre-step hook is a compute hook (trainmedic.probe.detail); torch's hook
    # table may only change on the training thread, outside its own loop over it.
    register_pre = optimizer_mod.register_optimizer_step_pre_hook
    handle = [register_pre(pre_hook)]

    def attach() -> None:
        if handle[0] is None:
            handle[0] = register_pre(pre_hook)

    def detach() -> None:
        if handle[0] is not None:
            handle[0].remove()
            handle[0] = None

    probe.restore.append(detach)
    probe.restore.append(optimizer_mod.register_optimizer_step_post_hook(post_hook).remove)
    if probe.detail is not None:
        probe.detail.add(DetailHook("steps", attach, detach, any_thread=False))


# --- outermost forward calls ---------------------------------------------------------------


def _install_forward(
    torch: Any, probe: ProbeSeam, tracker: StepTracker, missing: frozenset[str]
) -> None:
    watch = forward.install(torch, probe, tracker)  # see trainmedic.probe.forward
    if probe.detail is not None:
        probe.detail.add(DetailHook("forward", watch.resume, watch.suspend, any_thread=True))


# --- backward ----------------------------------------------------------------------------------


def _install_backward(
    torch: Any, probe: ProbeSeam, tracker: StepTracker, missing: frozenset[str]
) -> None:
    autograd = torch.autograd
    original = autograd.backward
    part = probe.parts["backward"]
    clock = probe.clock
    state = probe.state

    # No ``torch.compile`` test here: dynamo breaks its graph at ``backward()`` and
    # runs it eagerly, and the wrapper must then time it (compiled steps end at
    # backward calls). Left alone, dynamo would try to compile the wrapper's own
    # frame when a compiled function's eager part calls it: the thread test breaks
    # that graph (counted among the job's graph breaks) and an ``is_compiling()``
    # test would compile the timing away. Dynamo is told to skip the frame instead.
    @functools.wraps(original)
    def backward(*args: Any, **kwargs: Any) -> Any:
        if not part.on or _get_ident() != state.training_ident:
            return original(*args, **kwargs)
        try:
            if part.fault:
                part.check()
            tracker.backward_enter(clock())
        except Exception as exc:
            part.fail(exc)
            tracker.compute_exit(clock(), "backward")
            return original(*args, **kwargs)
        try:
            return original(*args, **kwargs)
        finally:
            try:
                tracker.backward_exit(clock())
            except Exception as exc:
                part.fail(exc)

    def attach() -> None:
        if autograd.backward is original:
            autograd.backward = backward

    def detach() -> None:
        if autograd.backward is backward:
            autograd.backward = original

    attach()
    probe.restore.append(detach)
    when_imported("torch._dynamo", lambda dynamo: _never_traced(dynamo, backward))
    if probe.detail is not None:
        probe.detail.add(DetailHook("backward", attach, detach, any_thread=True))


def _never_traced(dynamo: Any, fn: Any) -> None:
    """Have dynamo run ``fn``'s frame as it is, never trying to compile it (its recursive
    calls are dynamo's as usual), once dynamo is imported: the probe never imports it."""
    skip_code = getattr(getattr(dynamo, "eval_frame", None), "skip_code", None)
    if skip_code is None:
        return  # an older dynamo: it breaks its graph in the frame once, then skips it
    try:
        skip_code(fn.__code__)
    except Exception:
        return  # runs inside the job's import of dynamo: never let it fail


# --- DataLoaders ---------------------------------------------------------------------------------


def wait_for_batch(next_batch: Callable[[Any], Any], iterator: Any) -> Any:
    """The training thread's wait for a DataLoader batch: the real ``__next__``.

    A frame of its own, so that a sampler outside the process (the supervisor's,
    :mod:`trainmedic.supervise.observe.spy_trace`) tells a stack that waits for data
    by this function's name, whatever the probe's version and line numbers.
    """
    return next_batch(iterator)


def _install_loader(
    torch: Any, probe: ProbeSeam, tracker: StepTracker, missing: frozenset[str]
) -> None:
    data = torch.utils.data
    dataloader_mod = data.dataloader
    iter_cls = dataloader_mod._BaseDataLoaderIter
    loader_cls = data.DataLoader
    original_next = iter_cls.__next__
    original_iter = loader_cls.__iter__
    part = probe.parts["loader"]
    clock = probe.clock
    state = probe.state
    tensor = torch.Tensor
    sequences = (tuple, list)
    seen: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

    @functools.wraps(original_next)
    def __next__(self: Any) -> Any:
        if _get_ident() != state.training_ident or not part.on:
            return original_next(self)
        try:
            if part.fault:
                part.check()
            now = tracker.loader_since = clock()  # StepTracker.loader_enter, inline
            if not state.loader_used:
                probe.loader_in_use()
        except Exception as exc:
            part.fail(exc)
            return original_next(self)
        watch = probe.forward
        if watch is not None and watch.pending:
            try:
                watch.fetched(now)  # a point outside module calls: see probe.forward
            except Exception as exc:
                probe.parts["forward"].fail(exc)
        try:
            batch = wait_for_batch(original_next, self)
        except BaseException:
            try:  # the epoch's end (StopIteration) or the job's error: no batch
                tracker.loader_exit(clock(), None, False)
            except Exception as exc:
                part.fail(exc)
            raise
        try:
            # ``(x, y)`` batches without a call; anything else by batch_size().
            if type(batch) in sequences and batch and isinstance(batch[0], tensor):
                shape = batch[0].shape
                samples = shape[0] if shape else None
            else:
                samples = batch_size(batch, tensor)
            if tracker.gap is None:
                if tracker.loader_exit(clock(), samples, True):
                    overflow()  # more batches than usual: an evaluation, perhaps
            else:
                # A gap step's fetch (steps.GapSteps: the compute hooks off, no region
                # open, no CUDA marker to take): StepTracker.loader_exit's lines for
                # it, inline - a call less on most short steps.
                start = tracker.loader_since
                if start is not None:
                    tracker.loader_since = None
                    tracker.work += 1
                    seg = tracker.segment
                    if seg.t_start is None:
                        seg.t_start = start
                    seg.loader_wait += clock() - start
                    fetches = seg.fetches = seg.fetches + 1
                    if samples is not None:
                        taken = seg.loader_samples
                        seg.loader_samples = samples if taken is None else taken + samples
                    if fetches > tracker.fetch_limit:
                        overflow()
        except Exception as exc:
            part.fail(exc)
        return batch

    def overflow() -> None:
        detail = probe.detail
        if detail is not None:
            try:
                detail.fetch_overflow()
            except Exception as exc:
                probe.detail_failed(exc)

    @functools.wraps(original_iter)
    def __iter__(self: Any) -> Any:
        iterator = original_iter(self)
        if part.on:
            try:
                if self not in seen:
                    seen[self] = len(seen) + 1
                    probe.loader_created(self, seen[self])
            except Exception as exc:
                part.fail(exc)
        return iterator

    iter_cls.__next__ = __next__
    loader_cls.__iter__ = __iter__
    probe.restore.append(lambda: setattr(iter_cls, "__next__", original_next))
    probe.restore.append(lambda: setattr(loader_cls, "__iter__", original_iter))
    if "worker_loop" not in missing:
        _install_worker_loop(data, probe)
    if "pin_memory_loop" not in missing:
        _install_pin_loop(data, probe)


def _install_worker_loop(data: Any, probe: ProbeSeam) -> None:
    worker_mod = data._utils.worker
    original = worker_mod._worker_loop

    # ``functools.wraps`` keeps the name and module, so workers started with
    # the spawn method still find this function by name when unpickling.
    @functools.wraps(original)
    def _worker_loop(*args: Any, **kwargs: Any) -> Any:
        probe.become_worker()
        try:
            return original(*args, **kwargs)
        finally:
            probe.worker_done()

    worker_mod._worker_loop = _worker_loop
    probe.restore.append(lambda: setattr(worker_mod, "_worker_loop", original))


def _install_pin_loop(data: Any, probe: ProbeSeam) -> None:
    pin_mod = data._utils.pin_memory
    original = pin_mod._pin_memory_loop

    @functools.wraps(original)
    def _pin_memory_loop(*args: Any, **kwargs: Any) -> Any:
        ident = _get_ident()
        probe.state.pin_threads.add(ident)
        try:
            return original(*args, **kwargs)
        finally:
            probe.state.pin_threads.discard(ident)

    pin_mod._pin_memory_loop = _pin_memory_loop
    probe.restore.append(lambda: setattr(pin_mod, "_pin_memory_loop", original))
