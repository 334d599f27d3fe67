"""Run a callback right after a module is imported, without importing it ourselves.

The probe must not import torch before the job does (importing it costs
seconds, and a script that never uses torch must not pay). A meta-path
finder placed first on ``sys.meta_path`` waits for the import of the module:
it asks the other finders for the real spec, wraps the spec's loader so the
callback runs after the module body has executed, and then steps aside (the
module's ``__loader__`` and ``__spec__.loader`` are set back to the real
loader, and the finder removes itself).
"""

from __future__ import annotations

import sys
import threading

TYPE_CHECKING = False  # importlib.abc and typing cost milliseconds at the job's start-up
if TYPE_CHECKING:
    import importlib.machinery
    from collections.abc import Callable, Sequence
    from types import ModuleType
    from typing import Any

    Callback = Callable[[ModuleType], None]


class _PostImportLoader:
    """Delegates to the real loader; calls the callback after ``exec_module``."""

    def __init__(self, loader: Any, callback: Callback) -> None:
        self._loader = loader
        self._callback = callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        # Step aside: nothing later should ever see this wrapper.
        module.__loader__ = self._loader
        spec = getattr(module, "__spec__", None)
        if spec is not None:
            spec.loader = self._loader
        self._callback(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class PostImportFinder:
    """Calls ``callback(module)`` once, right after ``name`` is first imported."""

    def __init__(self, name: str, callback: Callback) -> None:
        self.name = name
        self._callback = callback
        self._local = threading.local()

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name or getattr(self._local, "busy", False):
            return None
        self._local.busy = True
        try:
            spec: importlib.machinery.ModuleSpec | None = None
            for finder in list(sys.meta_path):
                if finder is self:
                    continue
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                found: importlib.machinery.ModuleSpec | None = find(fullname, path, target)
                if found is not None:
                    spec = found
                    break
        finally:
            self._local.busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        self.remove()
        spec.loader = _PostImportLoader(spec.loader, self._callback)  # type: ignore[assignment]
        return spec

    def remove(self) -> None:
        # A try statement, not contextlib: this runs at the job's start-up.
        try:  # noqa: SIM105
            sys.meta_path.remove(self)
        except ValueError:
            pass


def when_imported(name: str, callback: Callback) -> None:
    """Call ``callback(module)`` after ``name`` is imported (now, if it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        callback(module)
        return
    sys.meta_path.insert(0, PostImportFinder(name, callback))
