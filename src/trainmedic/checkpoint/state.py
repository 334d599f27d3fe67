"""What a checkpoint holds: the objects' states and the RNG states, loadable with
``torch.load(weights_only=True)``.

RNG states are stored as lists, tensors and numbers the restricted unpickler
accepts; :func:`check_weights_only_safe` names the first value of a user's
``extra`` dict it would refuse, before anything is written. torch is imported
only inside these functions, when a checkpoint is saved or loaded.
"""

from __future__ import annotations

import random
import sys
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, Protocol

from trainmedic.checkpoint.files import CheckpointInfo
from trainmedic.errors import CheckpointError, UsageError


class SupportsStateDict(Protocol):
    """What a model, optimizer, scheduler or GradScaler offers."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state_dict: Any, /) -> Any: ...


def restore(
    payload: Mapping[str, Any],
    info: CheckpointInfo,
    model: SupportsStateDict | None,
    optimizer: SupportsStateDict | None,
    scheduler: SupportsStateDict | None,
    scaler: SupportsStateDict | None,
    rng: bool,
    strict: bool,
) -> None:
    import torch

    parts = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "scaler": scaler}
    for name, target in parts.items():
        if target is None:
            continue
        state = payload.get(name)
        if state is None:
            raise CheckpointError(
                f"checkpoint {info.data} has no {name} state, but a {name} was given to load()",
                directory=str(info.data.parent),
            )
        try:
            if name == "model" and isinstance(target, torch.nn.Module):
                target.load_state_dict(state, strict=strict)
            else:
                target.load_state_dict(state)
        except (RuntimeError, KeyError, ValueError, TypeError) as e:
            first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CheckpointError(
                f"checkpoint {info.data}: the saved {name} state does not fit: {first_line}",
                directory=str(info.data.parent),
            ) from e
    if rng and payload.get("rng") is not None:
        restore_rng(payload["rng"])


def capture_rng() -> dict[str, Any]:
    """RNG states as values the weights_only unpickler accepts (lists, tensors, numbers)."""
    import torch

    version, internal, gauss_next = random.getstate()
    state: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next},
        "torch_cpu": torch.get_rng_state(),
    }
    np = sys.modules.get("numpy")
    if np is not None:
        np_state = np.random.get_state(legacy=True)
        if isinstance(np_state, tuple):
            name, keys, pos, has_gauss, cached = np_state
            state["numpy"] = {
                "name": str(name),
                "keys": [int(k) for k in keys],
                "pos": int(pos),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(cached),
            }
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        state["torch_cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    import torch

    py = state.get("python")
    if py is not None:
        random.setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
    if state.get("torch_cpu") is not None:
        torch.set_rng_state(state["torch_cpu"])
    np_state = state.get("numpy")
    if np_state is not None:
        restore_numpy_rng(np_state)
    cuda_states = state.get("torch_cuda")
    if cuda_states and torch.cuda.is_available():
        # After a GPU was excluded there may be fewer devices than were saved.
        for index in range(min(len(cuda_states), torch.cuda.device_count())):
            torch.cuda.set_rng_state(cuda_states[index], index)


def restore_numpy_rng(np_state: Mapping[str, Any]) -> None:
    try:
        import numpy as np
    except ImportError:  # saved where numpy was imported, resumed where it is not installed
        return
    np.random.set_state(
        (
            np_state["name"],
            np.asarray(np_state["keys"], dtype=np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )


def check_weights_only_safe(value: Any, where: str) -> None:
    """Raise UsageError naming the first value ``torch.load(weights_only=True)`` would refuse."""
    import torch

    if value is None or type(value) in (bool, int, float, complex, str, bytes, bytearray):
        return
    if isinstance(value, (torch.Tensor, torch.Size, torch.dtype, torch.device)):
        return
    if type(value) in (list, tuple, set):
        for i, item in enumerate(value):
            check_weights_only_safe(item, f"{where}[{i}]")
        return
    if type(value) in (dict, OrderedDict):
        for key, item in value.items():
            check_weights_only_safe(key, f"{where} key {key!r}")
            check_weights_only_safe(item, f"{where}[{key!r}]")
        return
    kind = f"{type(value).__module__}.{type(value).__qualname__}"
    raise UsageError(
        f"{where}: a {kind} cannot be loaded with torch.load(weights_only=True); "
        "store plain numbers, strings, lists, dicts or tensors (numpy: .tolist() or "
        "torch.from_numpy())"
    )
