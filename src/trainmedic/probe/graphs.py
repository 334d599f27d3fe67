"""CUDA graphs under the probe: captures left untouched, replays counted as steps.

* ``CUDAGraph.capture_begin`` / ``capture_end`` bracket a capture: the CUDA
  part records no event and queries none meanwhile (either would invalidate
  the job's capture, even with the error swallowed).
* A graph whose capture contained an optimizer step (a whole training step
  captured with ``torch.cuda.graph``, a documented PyTorch pattern) runs one
  training step per ``replay()``, which no other hook sees: each replay of it
  ends a step, timed on the GPU like any other.
* The optimizer's parameters name the device the job computes on: the CUDA
  part records its events on that device's stream and reads that device's
  allocator statistics.

Under ``torch.compile`` tracing the optimizer hooks step aside (no graph break,
no guard on the probe's state); the device of an optimizer whose step is
compiled is read while dynamo traces it (:func:`trainmedic.probe.hookutil.run_while_tracing`).
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import TYPE_CHECKING, Any

from trainmedic.probe.hookutil import compiling_reader, run_while_tracing

if TYPE_CHECKING:
    from trainmedic.probe.seams import ProbeSeam
    from trainmedic.probe.steps import StepTracker

_get_ident = threading.get_ident


def _first_param_device(optimizer: Any) -> Any:
    for group in getattr(optimizer, "param_groups", ()):
        for p in group.get("params", ()):
            return getattr(p, "device", None)
    return None


def install_device_hook(torch: Any, probe: ProbeSeam, tracker: StepTracker) -> bool:
    """Tell the CUDA part which device each optimizer's parameters live on."""
    import importlib

    optimizer_mod = importlib.import_module("torch.optim.optimizer")
    part = probe.parts["cuda"]
    known: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    # Called from the hook, and while dynamo traces a compiled region that steps the
    # optimizer (run_while_tracing: no graph break, nothing of it in the graph), since
    # a compiled step runs no hook.
    @run_while_tracing
    def tell(optimizer: Any) -> None:
        cuda = probe.cuda
        if cuda is None or not part.on or _get_ident() != probe.state.training_ident:
            return
        try:
            device = known.get(optimizer)
            if device is None:
                device = _first_param_device(optimizer)
                known[optimizer] = device
            if device is not None and getattr(device, "type", None) == "cuda":
                cuda.use_device(device)
        except Exception as exc:
            part.fail(exc)

    def pre_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        tell(optimizer)

    handle = optimizer_mod.register_optimizer_step_pre_hook(pre_hook)
    probe.restore.append(handle.remove)
    return True


def install(torch: Any, probe: ProbeSeam, tracker: StepTracker) -> bool:
    """Wrap ``torch.cuda.CUDAGraph``'s capture and replay; ``False`` without it."""
    graph_cls = getattr(getattr(torch, "cuda", None), "CUDAGraph", None)
    if graph_cls is None or not hasattr(graph_cls, "replay"):
        return False
    import importlib

    optimizer_mod = importlib.import_module("torch.optim.optimizer")
    steps = probe.parts["steps"]
    clock = probe.clock
    state = probe.state
    begin, end, replay = graph_cls.capture_begin, graph_cls.capture_end, graph_cls.replay
    # graph -> id of the optimizer whose step it captured
    step_graphs: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
    capture = {"optimizer": None, "steps": 0}
    is_compiling = compiling_reader(torch)
    modules = sys.modules

    def post_hook(optimizer: Any, args: Any, kwargs: Any) -> None:
        # Not while dynamo traces (see torch_hooks._install_optimizer_hooks): reading
        # the capture count would guard the compiled code on it, and a capture by
        # ``torch.cuda.graph`` never happens inside a traced region.
        if "torch._dynamo" in modules and is_compiling():
            return
        cuda = probe.cuda
        if cuda is not None and cuda.captures:
            capture["optimizer"] = id(optimizer)
            capture["steps"] = int(capture["steps"] or 0) + 1

    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = begin(self, *args, **kwargs)
        cuda = probe.cuda
        if cuda is not None:
            cuda.captures += 1
            capture["optimizer"], capture["steps"] = None, 0
        return result

    def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        cuda = probe.cuda
        try:
            return end(self, *args, **kwargs)
        finally:
            if cuda is not None and cuda.captures:
                cuda.captures -= 1
                optimizer = capture["optimizer"]
                if optimizer is not None:
                    step_graphs[self] = int(optimizer)

    def graph_replay(self: Any, *args: Any, **kwargs: Any) -> Any:
        optimizer = step_graphs.get(self)
        if optimizer is None or not steps.on or _get_ident() != state.training_ident:
            return replay(self, *args, **kwargs)
        try:
            tracker.optimizer_enter(clock())
        except Exception as exc:
            steps.fail(exc)
            return replay(self, *args, **kwargs)
        try:
            return replay(self, *args, **kwargs)
        finally:
            try:
                tracker.optimizer_exit(clock(), optimizer)
            except Exception as exc:
                steps.fail(exc)

    for name, wrapper, original in (
        ("capture_begin", capture_begin, begin),
        ("capture_end", capture_end, end),
        ("replay", graph_replay, replay),
    ):
        wrapper.__doc__ = original.__doc__
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(graph_cls, name, wrapper)
        probe.restore.append(_restorer(graph_cls, name, original))
    handle = optimizer_mod.register_optimizer_step_post_hook(post_hook)
    probe.restore.append(handle.remove)
    return True


def _restorer(cls: Any, name: str, original: Any) -> Any:
    def restore() -> None:
        setattr(cls, name, original)

    return restore


def install_step_extras(
    torch: Any, probe: ProbeSeam, tracker: StepTracker, missing: frozenset[str] = frozenset()
) -> list[str]:
    """The hooks beyond torch_hooks': GradScaler skips, CUDA graphs, the event device.

    Each failure disables its own part only; returns the names installed. All three
    rest on the global optimizer step hooks; ``missing`` (features this torch lacks)
    leaves out what cannot be installed.
    """
    from trainmedic.probe import amp

    if "optimizer_step_hooks" in missing:
        return []
    installed: list[str] = []
    steps, cuda = probe.parts["steps"], probe.parts["cuda"]
    # A build of torch without CUDA has no graphs to replay and no device to time
    # on: their global optimizer hooks would cost every step a call for nothing.
    has_cuda = bool(getattr(getattr(torch, "version", None), "cuda", None))
    for name, part, installer, needs_cuda in (
        ("grad_scaler", steps, amp.install, False),
        ("cuda_graphs", steps, install, True),
        ("cuda_device", cuda, install_device_hook, True),
    ):
        if not part.on or name in missing or (needs_cuda and not has_cuda):
            continue
        try:
            if installer(torch, probe, tracker):
                installed.append(name)
        except Exception as exc:
            part.fail(exc)
    return installed
