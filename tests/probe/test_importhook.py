"""The post-import hook: runs after the module's body, never imports it itself."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from trainmedic.probe.importhook import PostImportFinder, when_imported


@pytest.fixture
def fake_module(tmp_path: Path) -> Iterator[str]:
    name = "tm_fake_torch"
    (tmp_path / f"{name}.py").write_text("VALUE = 41\nVALUE += 1\n")
    sys.path.insert(0, str(tmp_path))
    yield name
    sys.path.remove(str(tmp_path))
    sys.modules.pop(name, None)
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, PostImportFinder)]


def test_callback_runs_after_the_module_body_and_only_then(fake_module: str) -> None:
    seen: list[int] = []
    when_imported(fake_module, lambda m: seen.append(m.VALUE))
    assert seen == []
    assert fake_module not in sys.modules  # nothing imported on our behalf
    module = __import__(fake_module)
    assert seen == [42]
    # The hook leaves no trace: the real loader is back, the finder is gone.
    assert type(module.__loader__).__name__ == "SourceFileLoader"
    assert module.__spec__ is not None
    assert type(module.__spec__.loader).__name__ == "SourceFileLoader"
    assert not any(isinstance(f, PostImportFinder) for f in sys.meta_path)


def test_an_already_imported_module_gets_the_callback_at_once(fake_module: str) -> None:
    __import__(fake_module)
    seen: list[ModuleType] = []
    when_imported(fake_module, seen.append)
    assert [m.__name__ for m in seen] == [fake_module]


def test_other_imports_pass_through(fake_module: str) -> None:
    seen: list[str] = []
    when_imported(fake_module, lambda m: seen.append(m.__name__))
    import json  # noqa: F401

    assert seen == []
