"""Loads trainmedic's probe into this Python process; shared by both start-up routes.

Two routes run :func:`start` at interpreter start-up, both only when the
supervisor's variables are in the environment:

* ``sitecustomize`` in this directory, which ``trainmedic run`` puts first on
  the job's ``PYTHONPATH`` (any interpreter, as long as ``PYTHONPATH`` survives);
* ``trainmedic-probe.pth``, installed into site-packages with the package,
  which Python processes at every start of an interpreter of that environment
  (it survives a launch script that replaces ``PYTHONPATH``).

Either route loads this file from the supervisor's installation
(``TRAINMEDIC_PROBE_HOME``) without importing it by name, so the job's module
namespace stays as it was. Whichever runs first starts the probe; the other
finds it running (:func:`start` is idempotent), so the probe never loads twice.
The probe never makes this module raise: a failure leaves one line in the run
directory's ``bootstrap-errors.log`` and the job runs on.

Kept to old syntax on purpose: it runs in whatever Python the job uses.
"""

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import importlib.machinery  # noqa: F401 - used in type comments
    import types  # noqa: F401 - used in type comments


def note(exc):
    # type: (BaseException) -> None
    """Leave one line about ``exc`` in the run directory (never raises)."""
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


def module_from(spec):
    # type: (importlib.machinery.ModuleSpec) -> types.ModuleType
    """A module for ``spec`` without importing ``importlib.util`` (not loaded at start-up)."""
    import importlib

    bootstrap = getattr(importlib, "_bootstrap", None)
    if bootstrap is not None and hasattr(bootstrap, "module_from_spec"):
        return bootstrap.module_from_spec(spec)  # type: ignore[no-any-return]
    import importlib.util

    return importlib.util.module_from_spec(spec)


def start():
    # type: () -> None
    """Start the probe when the environment names a supervisor; idempotent."""
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
                module = module_from(spec)
                sys.modules["trainmedic"] = module
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    sys.modules.pop("trainmedic", None)
                    raise
        from trainmedic.probe import runtime

        runtime.activate()
    except Exception as exc:
        note(exc)
