"""``trainmedic attach PID``: why a job that is already running is slow, or whether it is stuck.

Observes from outside only (:mod:`trainmedic.attach`): no signal, no pause,
no code put into the job. Prints the job's processes, where its training
thread's time went, and the findings; ``--json`` writes the findings document,
``--dump DIR`` every thread's stacks as sampled.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from trainmedic.cli.options import FAIL_ON_CHOICES, exit_code_for, json_option
from trainmedic.cli.outputs import check_outputs, write_output
from trainmedic.errors import InputError
from trainmedic.findings.model import FindingsDocument
from trainmedic.ostext import printable

if TYPE_CHECKING:
    from trainmedic.attach.observe import Observation


@click.command("attach")
@click.argument("pid", type=click.IntRange(min=1))
@click.option(
    "--seconds",
    type=click.IntRange(1, 3600),
    default=30,
    show_default=True,
    help="How long to watch.",
)
@click.option(
    "--rate",
    type=click.IntRange(1, 1000),
    default=50,
    show_default=True,
    help="Stack samples a second per thread.",
)
@click.option("--native", is_flag=True, help="Sample native (C/C++) frames too (slower).")
@json_option("the findings document")
@click.option(
    "--dump",
    "dump_dir",
    metavar="DIR",
    help="Write every thread's sampled stacks (and py-spy's raw samples) to DIR.",
)
@click.option(
    "--fail-on",
    type=click.Choice(FAIL_ON_CHOICES),
    default="never",
    show_default=True,
    help="Exit 1 when a finding reaches this severity.",
)
@click.option(
    "--force", is_flag=True, help="Replace an existing --json FILE that is not a findings document."
)
def attach(
    pid: int,
    seconds: int,
    rate: int,
    native: bool,
    json_out: str | None,
    dump_dir: str | None,
    fail_on: str,
    force: bool,
) -> int:
    """Watch the running job at PID (the training process, or a launcher above it:
    torchrun, a shell script) for --seconds from outside, then say why it is slow or
    whether it is stuck. Needs the right to read the job's memory (docs/attach.md)."""
    from trainmedic.attach.judge import diagnose_attached
    from trainmedic.attach.observe import observe

    outputs = check_outputs({"--json": json_out}, force=force)
    dump = _dump_target(dump_dir)
    to_stdout = json_out == "-"
    console = Console(stderr=to_stdout, highlight=False)
    with tempfile.TemporaryDirectory(prefix="trainmedic-attach-") as tmp:
        with Progress(
            TextColumn("[bold]attach[/] {task.description}"),
            BarColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
            disable=not console.is_terminal,
        ) as bar:
            task = bar.add_task(f"pid {pid}", total=seconds)
            obs = observe(
                pid,
                seconds,
                Path(tmp),
                rate=rate,
                native=native,
                on_progress=lambda s: bar.update(task, completed=s),
            )
        if pid in obs.gone:
            raise InputError(f"process {pid} ended during the {obs.seconds:.0f} s window")
        findings = diagnose_attached(obs)
        document = FindingsDocument.build("attach", findings, time.time(), _context(obs))
        if dump is not None:
            _write_dump(dump, obs, Path(tmp))
    data = document.to_json()
    if to_stdout:
        sys.stdout.write(data)
    else:
        _print(console, obs, document)
        if "--json" in outputs:
            write_output(outputs["--json"], lambda f: f.write(data))
            console.print(f"json report written to {printable(str(outputs['--json'].path))}")
    return exit_code_for(document.findings, fail_on)


def _dump_target(dump_dir: str | None) -> Path | None:
    if dump_dir is None:
        return None
    path = Path(dump_dir)
    try:
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise InputError(f"--dump {printable(dump_dir)}: not an empty directory")
    except OSError as exc:
        raise InputError(f"--dump {printable(dump_dir)}: {exc.strerror}") from None
    return path


def _write_dump(path: Path, obs: Observation, workdir: Path) -> None:
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        lines: list[str] = []
        for (pid, tid), t in sorted(obs.sampling.threads.items()):
            proc = obs.tree.get(pid)
            lines.append(
                f"== {proc.describe() if proc else pid}, thread {tid} {t.name}: {t.total} samples"
            )
            for stack, n in sorted(t.stacks.items(), key=lambda kv: -kv[1])[:10]:
                lines.append(f"  {n} samples ({n / max(t.total, 1):.0%}):")
                lines.extend(f"    {f.file}:{f.line} {f.function}" for f in stack)
        (path / "stacks.txt").write_text("\n".join(lines) + "\n", errors="backslashreplace")
        for raw in sorted(workdir.glob("py-spy-*.txt")):
            (path / raw.name).write_bytes(raw.read_bytes())
    except OSError as exc:
        raise InputError(f"--dump {printable(str(path))}: {exc.strerror}") from None


def _context(obs: Observation) -> dict[str, Any]:
    from trainmedic.attach.judge import time_split, training_threads

    return {
        "pid": obs.tree.root,
        "window_s": round(obs.seconds, 1),
        "processes": [
            {
                "pid": p.pid,
                "ppid": p.ppid,
                "role": p.role,
                "rank": p.rank,
                "command": list(p.argv[:8]),
            }
            for p in obs.tree.processes
        ],
        "training_threads": [
            {
                "pid": t.process.pid,
                "tid": t.thread.tid,
                "samples": t.samples,
                "time_split": time_split(t),
            }
            for t in training_threads(obs)
        ],
        "stack_samples": obs.sampling.samples,
        "stack_sample_errors": obs.sampling.errors,
        "stacks_unavailable": obs.access or obs.sampling.problem,
        "usable_cores": obs.usable_cores,
    }


def _print(console: Console, obs: Observation, document: FindingsDocument) -> None:
    from trainmedic.attach.judge import time_split, training_threads
    from trainmedic.report.terminal import render_findings

    console.print(
        f"[bold]attached to pid {obs.tree.root}[/] for {obs.seconds:.0f} s: "
        f"{len(obs.tree.processes)} process(es)"
    )
    for p in obs.tree.processes:
        if p.role != "other" or p.pid == obs.tree.root:
            console.print(f"  {printable(p.describe())}")
    problem = obs.access or obs.sampling.problem
    if problem:
        console.print(f"[yellow]no stacks:[/] {printable(problem)}")
    for t in training_threads(obs):
        split = time_split(t)
        parts = ", ".join(
            f"{k.replace('_', ' ')} {v['share']:.0%} ({v['low']:.0%}-{v['high']:.0%})"
            for k, v in sorted(split.items(), key=lambda kv: -kv[1]["share"])
        )
        console.print(f"training thread of pid {t.process.pid} ({t.samples} samples): {parts}")
    console.print()
    render_findings(console, document.findings, "findings")


COMMAND = attach
