"""trainmedic's probe bootstrap, placed first on the job's PYTHONPATH by ``trainmedic run``.

Python imports ``sitecustomize`` at start-up; this one loads the probe when
the supervisor's variables are present, then runs the ``sitecustomize`` that
would have run without trainmedic (found on the rest of ``sys.path``), so a
user's or the system's keeps working. This directory leaves ``sys.path``
again: the job sees the path it would have seen. The probe never makes this
module raise; a chained ``sitecustomize`` raises exactly as it would have.

Kept to old syntax on purpose: it runs in whatever Python the job uses.
"""

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import importlib.machinery  # noqa: F401 - used in type comments
    import types  # noqa: F401 - used in type comments


def _trainmedic_here():
    # type: () -> str
    return os.path.dirname(os.path.abspath(__file__))


def _trainmedic_norm(entry):
    # type: (str) -> str
    try:
        return os.path.abspath(entry or os.curdir)
    except Exception:
        return entry


def _trainmedic_note(exc):
    # type: (BaseException) -> None
    run_dir = os.environ.get("TRAINMEDIC_RUN_DIR")
    if not run_dir:
        return
    try:
        # %-formatting on purpose: this file must parse on any Python the job may use.
        values = (os.getpid(), sys.version.split()[0], type(exc).__name__, exc)
        line = "%d %s: %s: %s\n" % values  # noqa: UP031
        fd = os.open(
            os.path.join(run_dir, "bootstrap-errors.log"),
            os.O_WRONLY | os.O_CREAT | os.O_APPEND,
            0o600,
        )
        try:
            os.write(fd, line.encode("utf-8", "replace"))
        finally:
            os.close(fd)
    except Exception:
        pass


def _trainmedic_module(spec):
    # type: (importlib.machinery.ModuleSpec) -> types.ModuleType
    # importlib.util.module_from_spec is importlib._bootstrap's, which is already
    # loaded; importing importlib.util would pull in contextlib and friends.
    import importlib

    bootstrap = getattr(importlib, "_bootstrap", None)
    if bootstrap is not None and hasattr(bootstrap, "module_from_spec"):
        return bootstrap.module_from_spec(spec)  # type: ignore[no-any-return]
    import importlib.util

    return importlib.util.module_from_spec(spec)


def _trainmedic_start(here):
    # type: (str) -> None
    if not os.environ.get("TRAINMEDIC_PROBE_ADDR"):
        return
    try:
        home = os.environ.get("TRAINMEDIC_PROBE_HOME")
        if "trainmedic" not in sys.modules and home:
            import importlib.machinery

            # Load our package from where the supervisor's copy lives, without
            # adding that directory (maybe a whole site-packages) to sys.path.
            spec = importlib.machinery.PathFinder.find_spec("trainmedic", [home])
            if spec is not None and spec.loader is not None:
                module = _trainmedic_module(spec)
                sys.modules["trainmedic"] = module
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    sys.modules.pop("trainmedic", None)
                    raise
        from trainmedic.probe import runtime

        runtime.activate()
    except Exception as exc:
        _trainmedic_note(exc)


def _trainmedic_chain(here):
    # type: (str) -> None
    import importlib.machinery

    rest = [p for p in sys.path if _trainmedic_norm(p) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = _trainmedic_module(spec)
    # The import system returns what sys.modules holds when this file ends.
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


def _trainmedic_main():
    # type: () -> None
    here = _trainmedic_here()
    sys.path[:] = [p for p in sys.path if _trainmedic_norm(p) != here]
    _trainmedic_start(here)
    _trainmedic_chain(here)


_trainmedic_main()
