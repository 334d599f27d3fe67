"""Skips for tests that need TensorFlow or Keras, found without importing them: the test
process keeps torch alone (TensorFlow runs in the tests' child processes)."""

from __future__ import annotations

import importlib.util

import pytest


def installed(name: str) -> bool:
    """Whether ``name`` can be imported here (it is not imported)."""
    return importlib.util.find_spec(name) is not None


def needs(*names: str) -> pytest.MarkDecorator:
    """A skip mark for a test module when any of ``names`` is not installed."""
    missing = [n for n in names if not installed(n)]
    return pytest.mark.skipif(bool(missing), reason=f"not installed: {', '.join(missing)}")
