"""Which of the torch APIs the probe hooks this torch has, and what is lost without each.

The probe runs with the job's own torch, whatever its release. Every API it
hooks is looked up here before anything is installed (feature detection, not
version numbers: builds and backports differ). Where one is missing the probe
installs what it still can and the run record says what is not measured: a
``probe_degraded`` event per process (``data``: the torch version, each
missing API with the release that brought it, the parts switched off), which
the diagnosis shows as the ``probe.degraded`` finding.

Supported: torch 2.0 and newer (the global optimizer step hooks appeared in
2.0). APIs newer than 2.0 that the probe uses have fallbacks and are not
listed: ``torch.compiler.is_compiling`` (2.3; before, ``torch._dynamo``'s),
``torch.is_autocast_enabled(device)`` (2.4; before, the per-device functions),
``torch.amp.GradScaler`` (2.3; before, ``torch.cuda.amp.GradScaler``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from trainmedic.probe.parts import Parts

OLDEST_SUPPORTED = (2, 0)
"""The oldest torch release the probe is built for (major, minor)."""


@dataclass(frozen=True)
class Gap:
    """One API the probe hooks that this torch lacks.

    Attributes:
        feature: the probe's name for what it hooks (``optimizer_step_hooks``).
        api: the torch names looked for.
        since: the torch release that brought them.
        part: the probe part that uses them (:data:`trainmedic.probe.parts.PART_NAMES`).
        whole_part: the part measures nothing without them (it is switched off).
        lost: what the run record lacks, and what is measured instead.
    """

    feature: str
    api: str
    since: str
    part: str
    whole_part: bool
    lost: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "feature": self.feature,
            "api": self.api,
            "since": self.since,
            "part": self.part,
            "whole_part": self.whole_part,
            "lost": self.lost,
        }


def _attr(root: Any, dotted: str) -> Any:
    """``root.a.b.c`` for ``dotted`` ``"a.b.c"``, or ``None`` where any link is missing."""
    value = root
    for name in dotted.split("."):
        value = getattr(value, name, None)
        if value is None:
            return None
    return value


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except Exception:
        return None


def find_gaps(torch: Any) -> list[Gap]:
    """The hooked APIs ``torch`` lacks (empty on a torch the probe fully supports)."""
    gaps: list[Gap] = []
    optimizer_mod = _module("torch.optim.optimizer")
    if _attr(optimizer_mod, "register_optimizer_step_pre_hook") is None or (
        _attr(optimizer_mod, "register_optimizer_step_post_hook") is None
    ):
        gaps.append(
            Gap(
                "optimizer_step_hooks",
                "torch.optim.optimizer.register_optimizer_step_pre_hook/_post_hook",
                "2.0",
                "steps",
                False,
                "optimizer steps are not seen: steps end at outermost backward calls "
                "(with gradient accumulation each micro-batch is a step), and GradScaler "
                "skips, CUDA-graph replays and the device of CUDA timing are not known",
            )
        )
    module_cls = _attr(torch, "nn.Module")
    if module_cls is None or "__call__" not in getattr(module_cls, "__dict__", {}):
        gaps.append(
            Gap(
                "module_call",
                "torch.nn.Module.__call__",
                "1.0",
                "forward",
                True,
                "forward passes are not timed: no compute time inside the model, batch "
                "sizes or autocast state from module calls",
            )
        )
    if not callable(_attr(torch, "autograd.backward")):
        gaps.append(
            Gap(
                "autograd_backward",
                "torch.autograd.backward",
                "1.0",
                "backward",
                True,
                "backward calls are not timed, and scripts without an optimizer get no steps",
            )
        )
    data = _attr(torch, "utils.data")
    iter_cls = _attr(data, "dataloader._BaseDataLoaderIter")
    if iter_cls is None or not hasattr(iter_cls, "__next__") or _attr(data, "DataLoader") is None:
        gaps.append(
            Gap(
                "dataloader_iter",
                "torch.utils.data.dataloader._BaseDataLoaderIter.__next__",
                "1.2",
                "loader",
                True,
                "time waiting for DataLoader batches is not measured: a step's data wait "
                "is the host time outside compute",
            )
        )
    if _attr(data, "_utils.worker._worker_loop") is None:
        gaps.append(
            Gap(
                "worker_loop",
                "torch.utils.data._utils.worker._worker_loop",
                "1.2",
                "stacks",
                False,
                "DataLoader worker processes are not sampled (where loading time goes)",
            )
        )
    if _attr(data, "_utils.pin_memory._pin_memory_loop") is None:
        gaps.append(
            Gap(
                "pin_memory_loop",
                "torch.utils.data._utils.pin_memory._pin_memory_loop",
                "1.2",
                "stacks",
                False,
                "pin-memory threads are not sampled",
            )
        )
    if _attr(torch, "version.cuda"):  # only a CUDA build times steps on the GPU
        gaps.extend(_cuda_gaps(torch))
    return gaps


def _cuda_gaps(torch: Any) -> list[Gap]:
    cuda = _attr(torch, "cuda")
    needed = ("Event", "is_initialized", "current_stream", "is_current_stream_capturing")
    absent = [name for name in needed if _attr(cuda, name) is None]
    gaps = []
    if absent:
        gaps.append(
            Gap(
                "cuda_events",
                ", ".join(f"torch.cuda.{name}" for name in absent),
                "1.10",
                "cuda",
                True,
                "GPU time per step and allocator peaks are not measured (CUDA events "
                "cannot be recorded safely)",
            )
        )
    graph = _attr(cuda, "CUDAGraph")
    if graph is None or not all(
        hasattr(graph, name) for name in ("capture_begin", "capture_end", "replay")
    ):
        gaps.append(
            Gap(
                "cuda_graphs",
                "torch.cuda.CUDAGraph.capture_begin/capture_end/replay",
                "1.10",
                "steps",
                False,
                "replays of a captured training step are not counted as steps",
            )
        )
    return gaps


def switch_off(gaps: list[Gap], parts: Parts, version: str) -> list[str]:
    """Switch off the parts that measure nothing without the APIs ``gaps`` lists;
    returns their names (each part's ``error`` says why)."""
    off: list[str] = []
    for gap in gaps:
        part = parts[gap.part]
        if gap.whole_part and part.on:
            part.on = False
            part.error = f"torch {version} has no {gap.api} (torch {gap.since}+)"
            off.append(part.name)
    return off


def too_old(version: str) -> bool:
    """Whether ``version`` (``torch.__version__``) is older than :data:`OLDEST_SUPPORTED`."""
    head = version.split("+", 1)[0].split(".")
    try:
        return (int(head[0]), int(head[1])) < OLDEST_SUPPORTED
    except (IndexError, ValueError):
        return False  # a version string of an unknown shape: judge by features only


def degraded_event_data(
    version: str, gaps: list[Gap], parts_off: list[str]
) -> tuple[str, dict[str, Any]]:
    """The ``probe_degraded`` event's message and data."""
    old = too_old(version)
    if gaps:
        lost = "; ".join(g.lost for g in gaps)
        names = ", ".join(g.api for g in gaps)
        message = f"probe: torch {version} lacks {names}: {lost}"
    else:
        message = f"probe: torch {version} is older than the oldest supported release"
    if old:
        message += f" (trainmedic's probe supports torch {'.'.join(map(str, OLDEST_SUPPORTED))}+)"
    data: dict[str, Any] = {
        "torch": version,
        "supported_from": ".".join(map(str, OLDEST_SUPPORTED)),
        "older_than_supported": old,
        "missing": [g.as_dict() for g in gaps],
        "parts_off": parts_off,
    }
    return message, data
