"""``MODULE:FACTORY``: the user's code that builds what a remedy measures.

``MODULE`` is a dotted module name, imported with the current directory first
on ``sys.path`` (as ``python -m`` does), or a path to a ``.py`` file
(anything ending in ``.py`` or containing a ``/``). ``FACTORY`` is a callable
in it, called without arguments; dotted names reach into objects
(``data:Builders.train``). Every failure is a :class:`FactoryError` with one
line naming what is wrong; the user's own traceback is kept on it for
``--verbose``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainmedic.errors import InputError


class FactoryError(InputError):
    """``MODULE:FACTORY`` could not be resolved or called.

    Attributes:
        user_traceback: the traceback of the user's code, when it raised.
    """

    def __init__(self, message: str, user_traceback: str | None = None) -> None:
        super().__init__(message)
        self.user_traceback = user_traceback


def _where(exc: BaseException) -> str:
    """``file:line`` of the innermost frame outside trainmedic and importlib."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for frame in reversed(frames):
        name = frame.filename
        if not name.startswith(own) and "importlib" not in name and not name.startswith("<"):
            shown = os.path.relpath(name)
            return f" at {name if shown.startswith('..') else shown}:{frame.lineno}"
    return ""


def _user_tb(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


def _split(spec: str) -> tuple[str, str]:
    module, sep, attr = spec.rpartition(":")
    if not sep or not module or not attr:
        raise FactoryError(
            f"{spec!r} is not MODULE:FACTORY (e.g. mydata:make_dataset or data.py:build)"
        )
    if not all(part.isidentifier() for part in attr.split(".")):
        raise FactoryError(f"{attr!r} in {spec!r} is not a Python name")
    return module, attr


def _import_file(path: str, spec_text: str) -> Any:
    file = Path(path)
    if not file.is_file():
        raise FactoryError(f"{path}: no such file (in {spec_text!r})")
    # Its own name when free: spawned DataLoader workers unpickle the dataset by
    # importing its module by name, from the parent's sys.path.
    name = file.stem
    if not name.isidentifier() or name in sys.modules:
        name = f"trainmedic_user_{abs(hash(str(file.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise FactoryError(f"{path}: not a Python file Python can import")
    module = importlib.util.module_from_spec(spec)
    # The file's own directory comes first, as for `python file.py`, and its
    # module is registered so that pickling (spawned DataLoader workers) finds it.
    sys.path.insert(0, str(file.resolve().parent))
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:
        sys.modules.pop(name, None)
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise FactoryError(
            f"importing {path} failed: {type(exc).__name__}: {exc}{_where(exc)}", _user_tb(exc)
        ) from None
    return module


def _import_module(name: str) -> Any:
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            raise FactoryError(
                f"no module named {name!r} (run from the directory that has it, or give "
                "a path to the .py file)"
            ) from None
        raise FactoryError(
            f"importing {name} failed: {type(exc).__name__}: {exc}{_where(exc)}", _user_tb(exc)
        ) from None
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise FactoryError(
            f"importing {name} failed: {type(exc).__name__}: {exc}{_where(exc)}", _user_tb(exc)
        ) from None


def _shadowed(name: str, module: Any) -> str:
    """When a ``NAME.py`` here is not the module imported under that name (the standard
    library's ``json``, an installed package), say so: the user meant their file."""
    local = Path(os.getcwd(), *name.split(".")).with_suffix(".py")
    found = getattr(module, "__file__", None)
    try:
        same = found is not None and Path(found).resolve() == local.resolve()
        if not local.is_file() or same:
            return ""
    except OSError:
        return ""
    where = "built into Python" if found is None else f"from {found}"
    return (
        f" ({name} is the module {where}, which hides your {local.name} here: give its "
        f"path, ./{local.name}:..., or rename it)"
    )


def resolve(spec: str) -> Callable[[], Any]:
    """The callable ``spec`` names (not called)."""
    module_text, attr = _split(spec)
    is_file = module_text.endswith(".py") or "/" in module_text
    module = _import_file(module_text, spec) if is_file else _import_module(module_text)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            hidden = _shadowed(module_text, module)
            raise FactoryError(f"{module_text} has no {attr!r}{hidden}") from None
    if not callable(obj):
        raise FactoryError(f"{spec}: {attr} is a {type(obj).__name__}, not a function")
    return obj  # type: ignore[no-any-return]


def call(spec: str) -> Any:
    """Resolve ``spec`` and call it; the user's exception becomes a :class:`FactoryError`."""
    factory = resolve(spec)
    try:
        return factory()
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise FactoryError(
            f"{spec} raised {type(exc).__name__}: {exc}{_where(exc)}", _user_tb(exc)
        ) from None
