"""A stand-in probe that records what the integrations tell trainmedic."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

import trainmedic.api


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def api_step(self) -> None:
        self.calls.append("step")

    def api_phase_enter(self, name: str) -> None:
        self.calls.append(f"+{name}")

    def api_phase_exit(self) -> None:
        self.calls.append("-")

    def phases(self) -> list[str]:
        """Each phase opened, in order, checking that every one was closed."""
        opened, depth = [], 0
        for c in self.calls:
            if c.startswith("+"):
                opened.append(c[1:])
                depth += 1
            elif c == "-":
                depth -= 1
                assert depth >= 0, self.calls
        assert depth == 0, self.calls
        return opened


@contextmanager
def recording(monkeypatch: pytest.MonkeyPatch) -> Iterator[Recorder]:
    recorder = Recorder()
    monkeypatch.setattr(trainmedic.api, "_probe", lambda: recorder)
    yield recorder
