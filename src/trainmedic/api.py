"""What a training script may call: ``trainmedic.step()`` and ``trainmedic.phase(name)``.

Both talk to the probe when the script runs under ``trainmedic run``;
otherwise they are no-ops costing a dictionary lookup. Neither imports torch.
"""

from __future__ import annotations

import sys
from contextlib import ContextDecorator
from types import TracebackType
from typing import Any

_RUNTIME = "trainmedic.probe.runtime"


def _probe() -> Any:
    runtime = sys.modules.get(_RUNTIME)
    return None if runtime is None else runtime.current()


def step() -> None:
    """Mark the end of a training step (for loops torch's hooks cannot see).

    Once called, this process's steps come from these calls only.
    """
    probe = _probe()
    if probe is not None:
        probe.api_step()


class phase(ContextDecorator):
    """Time spent inside is reported as phase ``name`` (``eval``, ``checkpoint``, ...)
    and kept out of the training step around it.

    Usable as ``with trainmedic.phase("eval"):`` or as a decorator.
    """

    def __init__(self, name: str) -> None:
        self.name = str(name)

    def __enter__(self) -> phase:
        probe = _probe()
        if probe is not None:
            probe.api_phase_enter(self.name)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        probe = _probe()
        if probe is not None:
            probe.api_phase_exit()
