"""trainmedic's probe bootstrap, placed first on the job's PYTHONPATH by ``trainmedic run``.

Python imports ``sitecustomize`` at start-up; this one loads the probe when
the supervisor's variables are present (``_trainmedic_probe_start.py``, which
the startup hook ``trainmedic-probe.pth`` runs too: whichever comes first
starts the probe, the other finds it running), then runs the
``sitecustomize`` that would have run without trainmedic (found on the rest
of ``sys.path``), so a user's or the system's keeps working. This directory
leaves ``sys.path`` again: the job sees the path it would have seen. The
probe never makes this module raise; a chained ``sitecustomize`` raises
exactly as it would have.

Kept to old syntax on purpose: it runs in whatever Python the job uses.
"""

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import importlib.machinery  # noqa: F401 - used in type comments
    import types  # noqa: F401 - used in type comments

_TRAINMEDIC_START = "_trainmedic_probe_start"


def _trainmedic_here():
    # type: () -> str
    return os.path.dirname(os.path.abspath(__file__))


def _trainmedic_norm(entry):
    # type: (str) -> str
    try:
        return os.path.abspath(entry or os.curdir)
    except Exception:
        return entry


def _trainmedic_load_start(here):
    # type: (str) -> types.ModuleType | None
    """The shared start module of this directory, loaded without a name in sys.modules."""
    import importlib.machinery

    spec = importlib.machinery.PathFinder.find_spec(_TRAINMEDIC_START, [here])
    if spec is None or spec.loader is None:
        return None
    module = type(sys)(_TRAINMEDIC_START)
    module.__file__ = spec.origin
    spec.loader.exec_module(module)
    return module


def _trainmedic_chain(here, start):
    # type: (str, types.ModuleType | None) -> None
    import importlib.machinery

    rest = [p for p in sys.path if _trainmedic_norm(p) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    if start is not None:
        module = start.module_from(spec)
    else:
        import importlib.util

        module = importlib.util.module_from_spec(spec)
    # The import system returns what sys.modules holds when this file ends.
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _trainmedic_main():
    # type: () -> None
    here = _trainmedic_here()
    sys.path[:] = [p for p in sys.path if _trainmedic_norm(p) != here]
    try:
        start = _trainmedic_load_start(here)
        if start is not None:
            start.start()
    except Exception:
        start = None
    _trainmedic_chain(here, start)


_trainmedic_main()
