"""The part every dataset wrapper of the remedies shares: it stands in for the dataset it wraps."""

from __future__ import annotations

from typing import Any


class DatasetWrapper:
    """A map-style dataset in front of ``self.dataset``: the same length, and the
    wrapped dataset's attributes (``classes``, ``targets``, ...) reachable through it."""

    dataset: Any

    def __len__(self) -> int:
        return len(self.dataset)

    def __getattr__(self, name: str) -> Any:
        # Only called for names this object lacks. ``dataset`` itself is guarded
        # so that unpickling (which has no attributes yet) cannot recurse.
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)
