"""The Keras and TensorFlow APIs the probe hooks: found in the job's own modules by their
dotted path (never importing a package the job did not), wrapped so that the probe puts
them back when it stops, and what is missing said as a ``probe_degraded`` event's data.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainmedic.probe.runtime import Probe


def resolve(path: str) -> Any:
    """The object at a dotted ``path`` (module attributes after the longest importable
    module), or ``None``. Only packages the job imported are read: a submodule of one
    may be imported, a package the job never imported never is (a Keras job on JAX
    must not load TensorFlow)."""
    import importlib
    import sys

    parts = path.split(".")
    if parts[0] not in sys.modules:
        return None
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        module = sys.modules.get(name)
        if module is None:
            try:
                module = importlib.import_module(name)
            except Exception:
                continue
        obj: Any = module
        for attr in parts[cut:]:
            obj = getattr(obj, attr, None)
            if obj is None:
                return None
        return obj
    return None


def patch(cls: Any, name: str, make: Callable[[Any], Any], probe: Probe) -> None:
    """``cls.name`` replaced by ``make(original)``, put back by the probe's restore."""
    original = cls.__dict__.get(name) or getattr(cls, name)
    setattr(cls, name, functools.wraps(original)(make(original)))
    probe.restore.append(lambda: setattr(cls, name, original))


def subclasses(cls: type) -> Iterator[type]:
    """Every subclass of ``cls``, at any depth, that exists now."""
    sub: type
    for sub in cls.__subclasses__():
        yield sub
        yield from subclasses(sub)


def keras_degraded_data(
    version: str, missing: list[dict[str, str]], lost: list[str]
) -> dict[str, Any]:
    """A ``probe_degraded`` event's data for Keras (:mod:`trainmedic.diagnose.probe_coverage`)."""
    return {
        "framework": "keras",
        "keras": version,
        "missing": missing,
        "lost": lost,
        "parts_off": [],
    }


def keras_version(module: str = "keras") -> str:
    """The version of the Keras the job imported as ``module`` (``unknown``: none)."""
    import sys

    found = sys.modules.get(module)
    return str(getattr(found, "__version__", "unknown"))
