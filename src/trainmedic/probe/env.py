"""The environment variables through which the supervisor configures the probe.

The supervisor (:mod:`trainmedic.supervise`) sets them on the job's
environment; every process of the job inherits them, so the probe in each
Python process finds the channel, the run directory and its settings here.
Without :data:`ADDR` the probe stays inactive and the public API is a no-op.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

ADDR = "TRAINMEDIC_PROBE_ADDR"
"""Where the supervisor listens: ``unix:/path`` or ``tcp:127.0.0.1:PORT``."""
TOKEN = "TRAINMEDIC_PROBE_TOKEN"
"""A random secret every connection presents first (a local TCP port is open to all users)."""
HOME = "TRAINMEDIC_PROBE_HOME"
"""Directory holding the ``trainmedic`` package the bootstrap loads."""
RUN_DIR = "TRAINMEDIC_RUN_DIR"
"""The run directory; error files go to its ``errors/`` subdirectory."""
DISABLE = "TRAINMEDIC_PROBE_DISABLE"
"""Comma-separated probe parts to leave off (``all`` disables the probe)."""
INJECT_FAULT = "TRAINMEDIC_PROBE_INJECT_FAULT"
"""Comma-separated probe parts that raise on first use: a self-test of failure isolation."""
PROFILE = "TRAINMEDIC_PROBE_PROFILE"
"""When the probe opens torch.profiler windows: ``auto`` (CUDA jobs, the default),
``always`` (any torch job) or ``off`` (:mod:`trainmedic.probe.profile_window`)."""
PROFILE_MODES = ("auto", "always", "off")
BOOTSTRAP_ERRORS = "bootstrap-errors.log"
"""File in the run directory where a bootstrap that failed to load the probe leaves one line."""


class ProbeConfig:
    """What the probe in one process was told by the supervisor.

    Attributes:
        address: ``unix:/path`` or ``tcp:127.0.0.1:PORT``.
        token: the secret the first message carries.
        run_dir: the run directory, or ``None``.
        disabled / inject_fault: probe part names (see :mod:`trainmedic.probe.parts`).
    """

    # A plain class, not a dataclass: this module loads at every Python start-up
    # of the job, and ``dataclasses`` alone costs several milliseconds there.
    __slots__ = ("address", "disabled", "inject_fault", "run_dir", "token")

    def __init__(
        self,
        address: str,
        token: str,
        run_dir: str | None,
        disabled: frozenset[str],
        inject_fault: frozenset[str],
    ) -> None:
        self.address = address
        self.token = token
        self.run_dir = run_dir
        self.disabled = disabled
        self.inject_fault = inject_fault

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> ProbeConfig | None:
        """The configuration in ``environ`` (``os.environ``), or ``None`` when no run is active."""
        env = os.environ if environ is None else environ
        address = env.get(ADDR)
        if not address:
            return None
        return cls(
            address=address,
            token=env.get(TOKEN, ""),
            run_dir=env.get(RUN_DIR) or None,
            disabled=_names(env.get(DISABLE)),
            inject_fault=_names(env.get(INJECT_FAULT)),
        )


def unknown_parts(environ: Mapping[str, str]) -> str | None:
    """What is wrong with the part names in :data:`DISABLE` and :data:`INJECT_FAULT`
    (one line), or ``None``: the probe itself ignores names it does not know, so
    ``trainmedic run`` refuses a misspelled one before the job starts."""
    from trainmedic.probe.parts import PART_NAMES

    for variable, extra in ((DISABLE, ("all",)), (INJECT_FAULT, ())):
        known = (*PART_NAMES, *extra)
        wrong = sorted(_names(environ.get(variable)) - set(known))
        if wrong:
            import difflib

            close = difflib.get_close_matches(wrong[0], known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            return (
                f"{variable} names no probe part {', '.join(wrong)}{hint}; "
                f"the parts are {', '.join(known)}"
            )
    return None


def settings_problem(environ: Mapping[str, str]) -> str | None:
    """What is wrong with the probe's settings in ``environ`` (one line), or ``None``:
    the part names (:func:`unknown_parts`) and :data:`PROFILE`."""
    wrong = unknown_parts(environ)
    if wrong is not None:
        return wrong
    mode = environ.get(PROFILE)
    if mode is not None and mode not in PROFILE_MODES:
        return f"{PROFILE}={mode!r} is not one of {', '.join(PROFILE_MODES)}"
    return None


def disabled_parts(environ: Mapping[str, str]) -> frozenset[str]:
    """The part names :data:`DISABLE` switches off in ``environ`` (``all`` among them)."""
    return _names(environ.get(DISABLE))


def _names(raw: str | None) -> frozenset[str]:
    return frozenset(n.strip() for n in (raw or "").split(",") if n.strip())
