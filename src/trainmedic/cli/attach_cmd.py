"""``trainmedic attach PID``: why a job that is already running is slow, or whether it is stuck.

Observes from outside only (:mod:`trainmedic.attach`): no signal, no pause,
no code put into the job. Prints the job's processes, where its training
thread's time went, and the findings; ``--json`` writes the findings document,
``--dump DIR`` every thread's stacks as sampled.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from trainmedic.cli.options import FAIL_ON_CHOICES, exit_code_for, json_option, simulate_option
from trainmedic.cli.outputs import check_outputs, write_output
from trainmedic.errors import InputError
from trainmedic.findings.model import FindingsDocument
from trainmedic.ostext import printable
from trainmedic.report.fix_text import Known

if TYPE_CHECKING:
    from trainmedic.attach.observe import Observation
    from trainmedic.attach.parts import TrainingThread
    from trainmedic.doctor.facts import MachineFacts
    from trainmedic.gpu.backend import GpuBackend


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
@click.option(
    "--native",
    is_flag=True,
    help="With --dump: native (C/C++) frames of every process even when the job is not "
    "stuck (reading them pauses each process for milliseconds; a stuck job gets them anyway).",
)
@json_option("the findings document")
@click.option("--html", "html_out", metavar="FILE", help="Write the report as an HTML page.")
@simulate_option
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
    html_out: str | None,
    simulate: str | None,
    dump_dir: str | None,
    fail_on: str,
    force: bool,
) -> int:
    """Watch the running job at PID (the training process, or a launcher above it:
    torchrun, a shell script) for --seconds from outside, then say why it is slow or
    whether it is stuck. Needs the right to read the job's memory (docs/attach.md)."""
    from trainmedic.attach.judge import diagnose_attached
    from trainmedic.attach.observe import observe
    from trainmedic.attach.parts import training_threads

    outputs = check_outputs({"--json": json_out, "--html": html_out}, force=force)
    dump = _dump_target(dump_dir)
    backend = _gpu_backend(simulate)
    facts = _MachineWatch(simulate).start()
    to_stdout = json_out == "-"
    console = Console(stderr=to_stdout, highlight=False)
    try:
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
                    on_progress=lambda s: bar.update(task, completed=s),
                    gpus=backend,
                )
            if pid in obs.gone:
                raise InputError(f"process {pid} ended during the {obs.seconds:.0f} s window")
            machine = facts.result()
            threads = training_threads(obs)
            findings = diagnose_attached(obs, machine=machine, threads=threads)
            context = _context(obs, threads, machine)
            document = FindingsDocument.build("attach", findings, time.time(), context)
            if dump is not None:
                _write_dump(dump, obs, Path(tmp), native or _is_stuck(document))
    finally:
        backend.close()
    data = document.to_json()
    if to_stdout:
        sys.stdout.write(data)
    else:
        _print(console, obs, threads, document)
    if "--json" in outputs:
        write_output(outputs["--json"], lambda f: f.write(data))
        console.print(f"json report written to {printable(str(outputs['--json'].path))}")
    if "--html" in outputs:
        from trainmedic.report.attach_html import render_attach_html

        page = render_attach_html(document)
        write_output(outputs["--html"], lambda f: f.write(page))
        console.print(f"html report written to {printable(str(outputs['--html'].path))}")
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


class _MachineWatch:
    """doctor's facts of this machine, read on a thread while the job is watched."""

    def __init__(self, simulate: str | None) -> None:
        self._simulate = simulate
        self._facts: MachineFacts | None = None
        self._thread = threading.Thread(target=self._read, name="trainmedic-attach-facts",
                                        daemon=True)  # fmt: skip

    def _read(self) -> None:
        from trainmedic.doctor.gather import DoctorRequest, gather_facts

        try:
            self._facts = gather_facts(DoctorRequest(simulate=self._simulate))
        except Exception:  # the machine's facts add to the verdict; their absence is said
            self._facts = None

    def start(self) -> _MachineWatch:
        self._thread.start()
        return self

    def result(self, timeout_s: float = 30.0) -> MachineFacts | None:
        self._thread.join(timeout_s)
        return self._facts


def _gpu_backend(simulate: str | None) -> GpuBackend:
    if simulate is not None:
        from trainmedic.simulation import load_simulation

        return load_simulation(simulate).backend
    from trainmedic.gpu.factory import open_nvml_or_none

    return open_nvml_or_none()


def _is_stuck(document: FindingsDocument) -> bool:
    return any(f.id == "failure.hang" for f in document.findings)


def _write_dump(path: Path, obs: Observation, workdir: Path, native: bool) -> None:
    """Every thread's sampled stacks, py-spy's raw samples, and (``native``) each
    process's stacks with native frames, which pauses it for a few milliseconds."""
    from trainmedic.attach.spy import dump_native

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
        if native and obs.access is None:
            notes = []
            for p in obs.tree.processes:
                if not p.python or p.pid in obs.gone:
                    continue
                text, why = dump_native(p.pid)
                if text is None:
                    notes.append(f"pid {p.pid}: {why}")
                    continue
                (path / f"native-{p.pid}.txt").write_text(text, errors="backslashreplace")
            if notes:
                (path / "native-problems.txt").write_text("\n".join(notes) + "\n")
    except OSError as exc:
        raise InputError(f"--dump {printable(str(path))}: {exc.strerror}") from None


def _context(
    obs: Observation, threads: list[TrainingThread], machine: MachineFacts | None
) -> dict[str, Any]:
    from trainmedic.attach.gpus import readings
    from trainmedic.attach.parts import time_split

    pids = [p.pid for p in obs.tree.processes]
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
            for t in threads
        ],
        "stack_samples": obs.sampling.samples,
        "stack_sample_errors": obs.sampling.errors,
        "stacks_unavailable": obs.access or obs.sampling.problem,
        "usable_cores": obs.usable_cores,
        "gpu_backend": obs.gpu.backend,
        "gpus_absent": obs.gpu.absent,
        "job_gpus": list(obs.gpu.job_gpus),
        "job_gpus_by": obs.gpu.matched_by or None,
        "gpus": readings(obs.gpu, pids),
        "machine": _machine(machine),
    }


def _machine(machine: MachineFacts | None) -> dict[str, Any] | None:
    """doctor's facts in brief, with the problems its checks find."""
    if machine is None:
        return None
    from trainmedic.doctor.runner import run_checks
    from trainmedic.findings.model import Severity

    problems = [
        {"id": f.id, "severity": str(f.severity), "title": f.title}
        for f in run_checks(machine)
        if f.severity is not Severity.INFO
    ]
    return {
        "hostname": machine.host.hostname,
        "gpus": [s.name for s in machine.gpu.samples],
        "driver_version": machine.gpu.driver.version if machine.gpu.driver else None,
        "torch_version": machine.torch.version if machine.torch else None,
        "problems": problems,
    }


def _print(
    console: Console,
    obs: Observation,
    threads: list[TrainingThread],
    document: FindingsDocument,
) -> None:
    from trainmedic.attach.parts import time_split
    from trainmedic.report.terminal import render_findings

    console.print(
        f"[bold]attached to pid {obs.tree.root}[/] for {obs.seconds:.0f} s: "
        f"{len(obs.tree.processes)} process(es)"
    )
    for p in obs.tree.processes:
        if p.role != "other" or p.pid == obs.tree.root:
            console.print(f"  {escape(printable(p.describe()))}", soft_wrap=True)
    problem = obs.access or obs.sampling.problem
    if problem:
        console.print(f"[yellow]no stacks:[/] {escape(printable(problem))}")
    for t in threads:
        split = time_split(t)
        parts = ", ".join(
            f"{k.replace('_', ' ')} {v['share']:.0%} ({v['low']:.0%}-{v['high']:.0%})"
            for k, v in sorted(split.items(), key=lambda kv: -kv[1]["share"])
        )
        console.print(f"training thread of pid {t.process.pid} ({t.samples} samples): {parts}")
    for g in document.context.get("gpus") or []:
        if not g["job"]:
            continue
        util = g["utilization_pct_mean"]
        used = g["memory_used_bytes_max"]
        console.print(
            f"GPU {g['index']} {escape(printable(str(g['name'])))}: "
            + (f"{util:.0f}% busy" if util is not None else "utilisation unknown")
            + (f", {used / 2**30:.1f} GiB used" if used is not None else "")
            + f" ({g['readings']} readings)"
        )
    machine = document.context.get("machine") or {}
    for m in machine.get("problems") or []:
        console.print(f"[yellow]machine:[/] {escape(printable(m['title']))} ({m['id']})")
    console.print()
    # The fixes' "py-spy dump --pid PID" is this job's training process, still running.
    pid = threads[0].process.pid if threads else obs.tree.root
    render_findings(console, document.findings, "findings", known=Known(pid=pid))


COMMAND = attach
