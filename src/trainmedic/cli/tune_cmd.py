"""``trainmedic tune``: measure and recommend settings for the user's own code.

``tune dataloader MODULE:FACTORY`` searches DataLoader settings
(:mod:`trainmedic.remedies.loader_tune`); ``tune batch-size MODULE:FACTORY``
finds the largest micro-batch that fits (:mod:`trainmedic.remedies.batch_size`).
``MODULE`` is a module name or a ``.py`` path (:mod:`trainmedic.remedies.factory`).
Errors in the user's code are one line; ``--verbose`` adds its traceback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stdout
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from trainmedic.cli.bounded import in_child, mark_done, run_bounded
from trainmedic.cli.options import FiniteRange, json_option
from trainmedic.cli.outputs import Output, check_outputs, write_output
from trainmedic.errors import InputError, TrainmedicError

_json_option = json_option("the result", " (a FILE can be given to trainmedic run --apply-from)")


def _budget_option(default: float, help: str) -> Callable[[Callable[..., Any]], Any]:
    """``--budget SECONDS``: a bound, enforced on a child (:mod:`trainmedic.cli.bounded`)."""
    return click.option(
        "--budget",
        type=FiniteRange(min=2.0, max=86400.0),
        default=default,
        show_default=True,
        metavar="SECONDS",
        help=help,
    )


def _verbose_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--verbose", "-v", is_flag=True, help="Show the traceback of errors in your code."
    )(fn)


@contextmanager
def _user_code(verbose: bool) -> Iterator[None]:
    """Errors of the user's code as one line (and their traceback with --verbose)."""
    from trainmedic.remedies.factory import FactoryError, _user_tb, _where

    try:
        yield
    except FactoryError as exc:
        if verbose and exc.user_traceback:
            click.echo(exc.user_traceback.rstrip(), err=True)
        raise
    except TrainmedicError:
        raise
    except Exception as exc:
        if verbose:
            click.echo(_user_tb(exc).rstrip(), err=True)
        raise InputError(
            f"your code raised {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            f"{_where(exc)}" + ("" if verbose else " (--verbose shows the traceback)")
        ) from None


def _common_args(json_out: str | None, verbose: bool) -> list[str]:
    """The ``--json`` and ``--verbose`` options again, for the child."""
    out = ["--verbose"] if verbose else []
    if json_out == "-":
        out.append("--json")  # last: a bare --json takes no value after it
    elif json_out is not None:
        out += ["--json", json_out]
    return out


def _check_json_target(json_out: str | None) -> Output | None:
    """Refuse an unwritable or foreign ``--json FILE`` before minutes of measuring, not after."""
    return check_outputs({"--json": json_out}, can_force=False).get("--json")


@contextmanager
def _quiet_stdout(json_out: str | None) -> Iterator[None]:
    """With the JSON on stdout, what the user's code prints goes to stderr instead."""
    if json_out != "-":
        yield
        return
    with redirect_stdout(sys.stderr):
        yield


def _emit(json_out: str | None, output: Output | None, data: dict[str, Any]) -> bool:
    """Write the JSON result; ``True`` when it went to stdout (no terminal report then)."""
    text = json.dumps(data, indent=2) + "\n"
    if json_out == "-":
        sys.stdout.write(text)
        return True
    if output is not None:
        write_output(output, lambda f: f.write(text))
    return False


@click.group("tune")
def tune() -> None:
    """Measure and recommend settings for your code (DataLoader, batch size)."""


@tune.command("dataloader")
@click.argument("factory", metavar="MODULE:FACTORY")
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="Samples per batch (default: the DataLoader's, else 32).",
)
@_budget_option(60.0, "Time to spend measuring; the measuring is stopped there.")
@click.option(
    "--step-ms",
    type=FiniteRange(min=0.0, max=600_000.0),
    default=0.0,
    metavar="MS",
    help="Your training step's time per batch, ms (e.g. compute per step of a run): "
    "the tuner keeps its process busy that long per batch, as training does. "
    "Default 0: the loader alone.",
)
@_json_option
@_verbose_option
def dataloader(
    factory: str,
    batch_size: int | None,
    budget: float,
    step_ms: float,
    json_out: str | None,
    verbose: bool,
) -> int:
    """Find faster DataLoader settings for the Dataset or DataLoader that
    MODULE:FACTORY returns (MODULE: a module name, or a path to a .py file).
    Measures samples/s across workers, threads, prefetching and pinned memory
    within the budget, and shows the speed-up over the current settings with
    its 95 % confidence interval."""
    from trainmedic.remedies import factory as factories
    from trainmedic.remedies.loader_tune import tune_dataloader

    output = _check_json_target(json_out)
    if not in_child():  # the user's code may block: a child the budget can stop
        args = ["tune", "dataloader", factory, "--budget", repr(budget), "--step-ms",
                repr(step_ms), *(["--batch-size", str(batch_size)] if batch_size else []),
                *_common_args(json_out, verbose)]  # fmt: skip
        return run_bounded(args, budget, "tune dataloader")
    err = Console(file=sys.stderr, highlight=False)
    quiet = json_out == "-"
    with _user_code(verbose), _quiet_stdout(json_out):
        source = factories.call(factory)
        result = tune_dataloader(
            source,
            batch_size=batch_size,
            budget_s=budget,
            step_s=step_ms / 1000.0,
            log=None if quiet else (lambda line: err.print(line, markup=False)),
        )
    data = result.to_dict()
    data["factory"] = factory
    if not _emit(json_out, output, data):
        _print_tuning(Console(highlight=False), result)
    mark_done()
    return 0


def _print_tuning(console: Console, result: Any) -> None:
    table = Table(title=f"DataLoader settings measured (batch size {result.batch_size})")
    for name in ("settings", "samples/s", "95 % CI", "start-up s", "phase"):
        table.add_column(name, justify="left" if name in ("settings", "phase") else "right")
    seen = set()
    for trial in result.trials:
        if trial.settings in seen and trial.phase == "confirm":
            continue
        seen.add(trial.settings)
        ci = trial.rate_ci
        table.add_row(
            trial.settings.label(),
            "failed" if trial.error else f"{trial.rate:.1f}",
            (trial.error or "")[:40]
            if trial.error
            else ("" if ci is None else f"{ci[0]:.0f}-{ci[1]:.0f}"),
            "" if trial.startup_s is None else f"{trial.startup_s:.2f}",
            trial.phase,
        )
    console.print(table)
    p = result.profile
    console.print(
        f"dataset: {p.kind}-bound ({p.cpu_share:.0%} of the read time on a CPU, "
        f"{p.sample_s * 1000:.2f} ms per sample); usable cores {result.limits.usable_cores:g}",
        markup=False,
    )
    ci = result.speedup_ci
    ci_text = "" if ci is None else f" (95 % CI {ci[0]:.2f}x-{ci[1]:.2f}x)"
    unsupported = _without_evidence(result)
    if unsupported is not None:
        console.print(unsupported, markup=False, soft_wrap=True)
    elif result.best.settings == result.baseline.settings:
        console.print(
            f"The current settings are the fastest of the {_measured(result)} measured: keep "
            "them.",
            markup=False,
        )
    else:
        console.print(
            f"speed-up over the current settings: {result.speedup:.2f}x{ci_text}, "
            f"{result.baseline.rate:.0f} -> {result.best.rate:.0f} samples/s",
            markup=False,
        )
        if not result.significant:
            console.print("  (not significant: the interval includes 1x)", markup=False)
        console.print("best settings:", markup=False)
        console.print(f"  {result.code()}", markup=False, soft_wrap=True)
    for note in result.notes:
        console.print(f"note: {note}", markup=False, soft_wrap=True)


def _measured(result: Any) -> int:
    return len({t.settings for t in result.trials if t.error is None})


def _without_evidence(result: Any) -> str | None:
    """What to say instead of advice when the measurements cannot support any: the
    current settings failed, or nothing but them was measured (and why)."""
    failed = {t.settings: t.error for t in result.trials if t.error}
    if result.baseline.error:
        return (
            f"No advice: the current settings failed ({result.baseline.error}), so there is "
            "nothing to be faster than. Fix that first (it fails in training too)."
        )
    if _measured(result) > 1:
        return None
    if failed:
        first = next(iter(failed.values()))
        return (
            f"No advice: only the current settings could be measured "
            f"({result.baseline.rate:.1f} samples/s); the {len(failed)} other settings tried "
            f"failed ({first}). Nothing shows that they are the fastest."
        )
    return (
        f"No advice: only the current settings were measured ({result.baseline.rate:.1f} "
        "samples/s) before the budget ran out; a larger --budget measures others."
    )


@tune.command("batch-size")
@click.argument("factory", metavar="MODULE:FACTORY")
@click.option(
    "--effective-batch-size",
    type=click.IntRange(min=1),
    default=None,
    help="The batch you train with: the accumulation steps keep it.",
)
@click.option("--max-size", type=click.IntRange(min=1), default=65536, show_default=True)
@_budget_option(600.0, "Time the search may take; it is stopped there.")
@click.option(
    "--margin",
    type=FiniteRange(0.0, 0.9),
    default=0.1,
    show_default=True,
    help="Share kept free below the largest size that fits.",
)
@_json_option
@_verbose_option
def batch_size_cmd(
    factory: str,
    effective_batch_size: int | None,
    max_size: int,
    budget: float,
    margin: float,
    json_out: str | None,
    verbose: bool,
) -> int:
    """Find the largest micro-batch a training step fits in memory. MODULE:FACTORY
    returns a dict: "model" (on its device), "make_batch" (n -> batch) or "sample"
    (one sample, repeated into batches), and optionally "loss_fn" ((model, batch)
    -> loss) and "optimizer"."""
    from trainmedic.remedies import factory as factories
    from trainmedic.remedies.batch_size import find_batch_size

    output = _check_json_target(json_out)
    if not in_child():  # a step that blocks, or a size that swaps: the budget stops it
        args = ["tune", "batch-size", factory, "--max-size", str(max_size), "--budget",
                repr(budget), "--margin", repr(margin),
                *(["--effective-batch-size", str(effective_batch_size)]
                  if effective_batch_size else []),
                *_common_args(json_out, verbose)]  # fmt: skip
        return run_bounded(args, budget, "tune batch-size")
    with _user_code(verbose), _quiet_stdout(json_out):
        spec = factories.call(factory)
        if not isinstance(spec, dict) or "model" not in spec:
            raise InputError(
                f"{factory} must return a dict with 'model' and 'make_batch' or 'sample'"
            )
        make_batch = spec.get("make_batch")
        if make_batch is None and "sample" in spec:
            sample = spec["sample"]

            def make_batch(n: int) -> Any:
                return sample.unsqueeze(0).expand(n, *sample.shape).contiguous()

        if make_batch is None:
            raise InputError(f"{factory} returned no 'make_batch' or 'sample'")
        result = find_batch_size(
            spec["model"],
            make_batch,
            loss_fn=spec.get("loss_fn"),
            optimizer=spec.get("optimizer"),
            max_size=max_size,
            margin=margin,
            effective_batch_size=effective_batch_size,
        )
    data = result.to_dict()
    data["factory"] = factory
    if _emit(json_out, output, data):
        mark_done()
        return 0
    console = Console(highlight=False)
    table = Table(title="Batch sizes tried")
    for name in ("size", "fits", "step s", "samples/s"):
        table.add_column(name, justify="right")
    for t in result.trials:
        table.add_row(
            str(t.size),
            "yes" if t.fits else "out of memory",
            "" if t.step_s is None else f"{t.step_s:.4f}",
            "" if t.samples_per_s is None else f"{t.samples_per_s:.1f}",
        )
    console.print(table)
    limit = (
        f"the first failure at {result.first_failure}"
        if result.first_failure is not None
        else f"no failure up to --max-size {max_size}"
    )
    console.print(f"largest that fits: {result.largest_fit} ({limit})", markup=False)
    line = f"micro-batch {result.micro_batch_size}"
    if result.effective_batch_size is not None:
        line += (
            f" x {result.accumulation_steps} accumulation steps = "
            f"{result.micro_batch_size * result.accumulation_steps} "
            f"(effective batch {result.effective_batch_size})"
        )
    console.print(line, markup=False)
    mark_done()
    return 0


COMMAND = tune
