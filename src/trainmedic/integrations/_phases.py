"""Open and close trainmedic phases from framework callbacks (begin and end arrive
in different calls, so the ``with`` form cannot be used)."""

from __future__ import annotations

from trainmedic.api import phase


class PhaseStack:
    """Phases a callback opened, innermost last; closed in order, never twice."""

    def __init__(self) -> None:
        self._open: list[phase] = []

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self._open)

    def enter(self, name: str) -> None:
        p = phase(name)
        p.__enter__()
        self._open.append(p)

    def exit(self, name: str) -> bool:
        """Close ``name`` (and anything opened inside it); ``False`` when it is not open."""
        if name not in self.names:
            return False
        while self._open:
            p = self._open.pop()
            p.__exit__(None, None, None)
            if p.name == name:
                return True
        return True

    def close_all(self) -> None:
        while self._open:
            self._open.pop().__exit__(None, None, None)
