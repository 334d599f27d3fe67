"""Makes the modules named in ``GPU_CHECK_ABSENT`` (comma-separated top-level names)
unimportable, here and in every Python process started with this directory on
``PYTHONPATH``: ``scripts/gpu-check --preflight`` runs as if on the GPU machine,
where they are not installed. ``importlib.util.find_spec`` answers ``None`` for
them, as for a module that is not there.

Then runs the ``sitecustomize`` that would have run without this one.
"""

import importlib.machinery
import importlib.util
import os
import sys

ENV = "GPU_CHECK_ABSENT"


def _hide(names: str) -> None:
    for name in filter(None, (n.strip() for n in names.split(","))):
        # None in sys.modules: "import x" raises ModuleNotFoundError, find_spec("x") is None.
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules[__name__] = module
    spec.loader.exec_module(module)


_hide(os.environ.get(ENV, ""))
_chain()
