"""The options of ``trainmedic run`` that keep a job alive: timeouts, restarts, resume.

:func:`resilience_options` adds them to a command and hands the command one
:class:`~trainmedic.supervise.loop.attempts.ResilienceOptions` (keyword
``resilience``) instead of ten loose values; bad values are usage errors
(exit 2, one line). docs/restarts.md explains each.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar

import click

from trainmedic.errors import UsageError

F = TypeVar("F", bound=Callable[..., Any])

_SECONDS = click.FLOAT


_OPTIONS = (
    click.option(
        "--max-restarts",
        type=click.IntRange(min=0),
        default=3,
        show_default=True,
        help="Give up after N restarts in a row that made no progress (an attempt that "
        "trained for a while resets the count; 0: never restart).",
    ),
    click.option(
        "--max-total-restarts",
        type=click.IntRange(min=0),
        default=None,
        metavar="N",
        help="Restart at most N times in all, progress or not (torchrun's --max-restarts) "
        "[default: no cap].",
    ),
    click.option(
        "--timeout",
        "timeout_s",
        type=_SECONDS,
        default=None,
        metavar="SECONDS",
        help="Fixed step timeout instead of the learned one: a job without a step (or a "
        "marked phase) for this long is hung.",
    ),
    click.option(
        "--startup-timeout",
        "startup_timeout_s",
        type=_SECONDS,
        default=None,
        metavar="SECONDS",
        help="Time allowed until the first step [default: 1800].",
    ),
    click.option(
        "--timeout-floor",
        "timeout_floor_s",
        type=_SECONDS,
        default=None,
        metavar="SECONDS",
        help="The step timeout for a silence the evidence shows to be a hang (blocked, "
        "spinning, waiting on a peer or a data source) is never below this [default: 20].",
    ),
    click.option(
        "--unclear-timeout",
        "unclear_timeout_s",
        type=_SECONDS,
        default=None,
        metavar="SECONDS",
        help="The step timeout for a silence the evidence cannot classify is never below "
        "this [default: 120, or the floor if higher].",
    ),
    click.option(
        "--work-cap",
        "work_cap_s",
        type=_SECONDS,
        default=None,
        metavar="SECONDS",
        help="A silence with work (an unmarked evaluation, a large write) is allowed this "
        "long after the last step [default: 7200].",
    ),
    click.option(
        "--time-budget",
        "time_budget_s",
        type=_SECONDS,
        default=None,
        metavar="SECONDS",
        help="No restart once the run has used this long in all.",
    ),
    click.option(
        "--grace",
        "grace_s",
        type=_SECONDS,
        default=10.0,
        show_default=True,
        metavar="SECONDS",
        help="Between SIGTERM and SIGKILL when stopping a hung job, or after a SIGTERM "
        "to trainmedic (time for the job to save and exit).",
    ),
    click.option(
        "--backoff",
        "backoff_s",
        type=_SECONDS,
        default=5.0,
        show_default=True,
        metavar="SECONDS",
        help="Wait before the second restart in a row without progress (the first is "
        "immediate), doubling after (at most 120 s), plus jitter; from the first "
        "restart when the cause lies outside the job. 0: never wait.",
    ),
    click.option(
        "--resume-args",
        metavar="TEMPLATE",
        default=None,
        help="Arguments added on restarts, with {checkpoint} (newest valid checkpoint) and "
        '{step}, e.g. "--resume {checkpoint}".',
    ),
    click.option(
        "--checkpoint-glob",
        metavar="PATTERN",
        default=None,
        help="The script's own checkpoint files (e.g. 'ckpt/*.pt'), newest first; default: "
        "the Checkpointer's in $TRAINMEDIC_CHECKPOINT_DIR.",
    ),
    click.option(
        "--retry-on-exception",
        is_flag=True,
        help="Restart after a Python exception (a bug) or a non-zero exit too.",
    ),
)
_NAMES = (
    "max_restarts",
    "max_total_restarts",
    "timeout_s",
    "startup_timeout_s",
    "timeout_floor_s",
    "unclear_timeout_s",
    "work_cap_s",
    "time_budget_s",
    "grace_s",
    "backoff_s",
    "resume_args",
    "checkpoint_glob",
    "retry_on_exception",
)


def resilience_options(fn: F) -> F:
    """Add the options; the command receives ``resilience=ResilienceOptions(...)``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        values = {name: kwargs.pop(name) for name in _NAMES}
        kwargs["resilience"] = build_resilience(**values)
        return fn(*args, **kwargs)

    decorated: Callable[..., Any] = wrapper
    for option in reversed(_OPTIONS):
        decorated = option(decorated)
    return decorated  # type: ignore[return-value]


MAX_SECONDS = 366 * 24 * 3600.0
"""Longest duration any of these options takes (a year): past it, timers overflow."""


def _seconds(name: str, value: float | None, *, zero: bool = False) -> float | None:
    if value is None:
        return None
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise UsageError(f"{name} must be a positive number of seconds, got {value:g}")
    if value > MAX_SECONDS:
        raise UsageError(f"{name} must be at most {MAX_SECONDS:.0f} s (a year), got {value:g}")
    return value


def build_resilience(
    *,
    max_restarts: int = 3,
    max_total_restarts: int | None = None,
    timeout_s: float | None = None,
    startup_timeout_s: float | None = None,
    timeout_floor_s: float | None = None,
    unclear_timeout_s: float | None = None,
    work_cap_s: float | None = None,
    time_budget_s: float | None = None,
    grace_s: float = 10.0,
    backoff_s: float = 5.0,
    resume_args: str | None = None,
    checkpoint_glob: str | None = None,
    retry_on_exception: bool = False,
) -> Any:
    """The :class:`ResilienceOptions` for these option values."""
    from trainmedic.resilience.timeouts import TimeoutConfig
    from trainmedic.supervise.loop.attempts import ResilienceOptions
    from trainmedic.supervise.loop.resume import parse_resume_template

    fixed = _seconds("--timeout", timeout_s)
    startup = _seconds("--startup-timeout", startup_timeout_s)
    floor = _seconds("--timeout-floor", timeout_floor_s)
    unclear = _seconds("--unclear-timeout", unclear_timeout_s)
    cap = _seconds("--work-cap", work_cap_s)
    budget = _seconds("--time-budget", time_budget_s)
    grace = _seconds("--grace", grace_s, zero=True)
    backoff = _seconds("--backoff", backoff_s, zero=True)
    defaults = TimeoutConfig()
    floor_s = floor if floor is not None else defaults.floor_s
    config = TimeoutConfig(
        startup_s=startup if startup is not None else defaults.startup_s,
        fixed_s=fixed,
        floor_s=floor_s,
        # Unclear silences keep the conservative bound unless asked otherwise; a
        # floor set above it raises it too.
        unclear_floor_s=unclear if unclear is not None else max(defaults.unclear_floor_s, floor_s),
        progress_cap_s=cap if cap is not None else defaults.progress_cap_s,
    )
    if checkpoint_glob is not None and not checkpoint_glob.strip():
        raise UsageError("--checkpoint-glob is empty")
    return ResilienceOptions(
        max_restarts=max_restarts,
        max_total_restarts=max_total_restarts,
        time_budget_s=budget,
        timeout=config,
        # Only the startup bound applies before a step: --timeout alone does not
        # arm the watchdog for a job whose steps the probe cannot see.
        explicit_timeout=startup is not None,
        grace_s=grace if grace is not None else 10.0,
        backoff_s=backoff if backoff is not None else 5.0,
        resume_args=parse_resume_template(resume_args) if resume_args is not None else None,
        checkpoint_glob=checkpoint_glob,
        retry_on_exception=retry_on_exception,
    )
