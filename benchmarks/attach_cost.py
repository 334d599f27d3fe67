"""What ``trainmedic attach`` costs the job it watches, as the job itself measures it.

Each run starts a plain training job (``benchmarks/attach_job.py``: an MLP on
fixed in-memory batches, one torch thread, started without trainmedic) that
writes one line per step: the step's end on ``CLOCK_MONOTONIC`` and its
training thread's CPU time. Once it trains, three phases follow in this
process's own time on the same clock: ``--before`` seconds untouched, then
``python -m trainmedic attach PID --seconds S --rate R`` in a process of its
own, from its start to its exit (Python's start-up, the py-spy window, the
diagnosis and the report: all that attaching is), then ``--after`` seconds
untouched again. From the job's own lines, per phase: steps a second (the
steps that ended in the phase, first to last), the training thread's CPU a
step, and its run-queue wait (``/proc/PID/task/PID/schedstat``, read at the
phase's ends) as a share of the phase. The ratios during/before and
after/before are per run; after/before is the yardstick of the machine's own
drift, and during against the mean of before and after takes out a drift
that runs through the job's life (on the project's VM a job's speed moves
by itself by up to 15 % within half a minute, with or without attach). attach's CPU is read at its
exit, before it is reaped (``waitid(WNOWAIT)``, then ``/proc/PID/stat``): its
own (Python) and its children's (py-spy, the only program it starts), and
the whole from ``wait4``'s resource usage.

Every (model, rate) runs ``--repeats`` times, in rounds whose order
alternates (forward, then backward), so a load that drifts weighs on them
alike; the tables give medians over the repeats with the lowest..highest
run. The load average is printed at the start and the end.

    python benchmarks/attach_cost.py [--models small,large] [--rates 50,100] [--repeats 3]
        [--before 7] [--seconds 10] [--after 7] [--quick] [--same-core] [--raw FILE]

``--same-core`` pins the job and attach (py-spy with it) to one CPU, as on a
machine with no core to spare: then the job pays for all the CPU attach takes.

Defaults take about 6 minutes; ``--quick`` (one repeat, phases of 5, 6 and 5 s)
about 1.5.
"""

from __future__ import annotations

import argparse
import compileall
import itertools
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB = HERE / "attach_job.py"
sys.path.insert(0, str(HERE))

from overhead import bench_line, median  # noqa: E402

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PHASES = ("before", "during", "after")


@dataclass
class Phase:
    """The job in one phase, from its own lines."""

    start: float
    end: float
    steps: int
    steps_per_s: float
    median_step_s: float
    cpu_per_step_s: float
    run_queue_share: float
    others_cores: float
    """The machine's CPU besides the job's, in cores (attach's included, during)."""
    steal_cores: float


@dataclass
class Run:
    model: str
    rate: int
    repeat: int
    load: float
    phases: dict[str, Phase] = field(default_factory=dict)
    attach_rc: int = 0
    attach_wall_s: float = 0.0
    attach_own_cpu_s: float = 0.0
    attach_children_cpu_s: float = 0.0
    attach_total_cpu_s: float = 0.0
    samples: int | None = None
    findings: list[str] = field(default_factory=list)

    def ratio(self, phase: str, key: str = "steps_per_s") -> float:
        return float(getattr(self.phases[phase], key) / getattr(self.phases["before"], key))

    def bracketed(self, key: str = "steps_per_s") -> float:
        """During against the mean of before and after: a drift through the job's life
        (its speed moves by itself, ±10 % here) weighs on both sides alike."""
        around = (getattr(self.phases["before"], key) + getattr(self.phases["after"], key)) / 2
        return float(getattr(self.phases["during"], key) / around)


def cpu_ticks() -> list[int]:
    """The machine's CPU time so far, all cores: ``/proc/stat``'s first line, in ticks."""
    return [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]


@dataclass(frozen=True)
class Mark:
    """The counters at one end of a phase."""

    time: float
    run_queue_ns: int
    job_ticks: int
    busy_ticks: int
    steal_ticks: int

    @classmethod
    def now(cls, pid: int) -> Mark:
        """The job's main thread's wait for a CPU so far (``schedstat``'s second field),
        the job's CPU (all its threads) and the machine's busy and stolen time."""
        queued = int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[1])
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = cpu_ticks()
        busy = sum(cpu[:8]) - cpu[3] - cpu[4] - cpu[7]  # less idle, iowait and steal
        return cls(time.monotonic(), queued, int(stat[11]) + int(stat[12]), busy, cpu[7])


def zombie_cpu(pid: int) -> tuple[float, float]:
    """An exited, not yet reaped process's own CPU seconds and its reaped children's."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    children = (int(fields[13]) + int(fields[14])) / CLOCK_TICKS
    return own, children


def phase(stamps: list[tuple[float, float]], first: Mark, last: Mark) -> Phase:
    start, end = first.time, last.time
    inside = [s for s in stamps if start <= s[0] <= end]
    if len(inside) < 3:
        raise RuntimeError(f"only {len(inside)} steps ended in a {end - start:.1f} s phase")
    n = len(inside) - 1
    span = inside[-1][0] - inside[0][0]
    steps = [b[0] - a[0] for a, b in itertools.pairwise(inside)]
    return Phase(
        start,
        end,
        len(inside),
        n / span,
        statistics.median(steps),
        (inside[-1][1] - inside[0][1]) / n,
        (last.run_queue_ns - first.run_queue_ns) / 1e9 / (end - start),
        (last.busy_ticks - first.busy_ticks - last.job_ticks + first.job_ticks)
        / CLOCK_TICKS
        / (end - start),
        (last.steal_ticks - first.steal_ticks) / CLOCK_TICKS / (end - start),
    )


def pin(core: int | None) -> Callable[[], None] | None:
    """What puts a child (and all it starts) on ``core`` alone, or ``None``."""
    if core is None:
        return None
    return lambda: os.sched_setaffinity(0, {core})


def attach_argv(pid: int, seconds: int, rate: int, doc: Path) -> list[str]:
    return [sys.executable, "-m", "trainmedic", "attach", str(pid), "--seconds", str(seconds),
            "--rate", str(rate), "--json", str(doc)]  # fmt: skip


def one_run(model: str, rate: int, repeat: int, args: argparse.Namespace, tmp: Path) -> Run:
    name = f"{model}-{rate}-{repeat}"
    steps_file, doc, said = tmp / f"{name}.steps", tmp / f"{name}.json", tmp / f"{name}.out"
    run = Run(model, rate, repeat, os.getloadavg()[0])
    job = subprocess.Popen(
        [sys.executable, str(JOB), "--model", model, "--out", str(steps_file),
         "--warmup", str(args.warmup)],
        stdout=subprocess.PIPE, text=True, preexec_fn=pin(args.same_core),
    )  # fmt: skip
    assert job.stdout is not None
    try:
        if job.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the {model} job did not start")
        marks = [Mark.now(job.pid)]
        time.sleep(args.before)
        marks.append(Mark.now(job.pid))
        with said.open("w") as out:
            attach = subprocess.Popen(
                attach_argv(job.pid, args.seconds, rate, doc),
                stdout=out,
                stderr=out,
                preexec_fn=pin(args.same_core),
            )
            os.waitid(os.P_PID, attach.pid, os.WEXITED | os.WNOWAIT)
            marks.append(Mark.now(job.pid))
            run.attach_own_cpu_s, run.attach_children_cpu_s = zombie_cpu(attach.pid)
            _, status, usage = os.wait4(attach.pid, 0)
            attach.returncode = run.attach_rc = os.waitstatus_to_exitcode(status)
        run.attach_wall_s = marks[2].time - marks[1].time
        run.attach_total_cpu_s = usage.ru_utime + usage.ru_stime
        time.sleep(args.after)
        marks.append(Mark.now(job.pid))
    finally:
        job.terminate()
        stdout, _ = job.communicate(timeout=120)
    bench_line(stdout)  # the job ended as it would have, and said so
    if run.attach_rc != 0:
        raise RuntimeError(f"attach exited {run.attach_rc}:\n{said.read_text()[-3000:]}")
    document = json.loads(doc.read_text())
    run.samples = sum(t["samples"] for t in document["context"]["training_threads"]) or None
    run.findings = sorted({f["id"] for f in document["findings"]})
    lines = steps_file.read_text().splitlines()
    stamps = [(float(a), float(b)) for a, b in (line.split() for line in lines)]
    for i, key in enumerate(PHASES):
        run.phases[key] = phase(stamps, marks[i], marks[i + 1])
    return run


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}..{max(values):.3f})"


def report(runs: list[Run], args: argparse.Namespace) -> list[str]:
    configs = sorted({(r.model, r.rate) for r in runs}, key=lambda c: (c[0] != "small", c))
    lines = [
        "**What the job sees** (its own steps/s; median over the repeats, lowest..highest run)",
        "",
        "| job | rate | step before | steps/s before | steps/s, during / before "
        "| steps/s, after / before | steps/s, during / mean of before and after "
        "| CPU a step, during / mean of before and after | run-queue wait, before / during / after "
        "| CPU besides the job, before / during / after |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model, rate in configs:
        rs = [r for r in runs if (r.model, r.rate) == (model, rate)]

        def med(key: str, phase: str, rs: list[Run] = rs) -> float:
            return statistics.median(float(getattr(r.phases[phase], key)) for r in rs)

        queue = " / ".join(f"{med('run_queue_share', p):.1%}" for p in PHASES)
        others = " / ".join(f"{med('others_cores', p):.2f}" for p in PHASES)
        lines.append(
            f"| {model} | {rate} | {med('median_step_s', 'before') * 1e3:.2f} ms "
            f"| {med('steps_per_s', 'before'):.1f} "
            f"| {spread([r.ratio('during') for r in rs])} "
            f"| {spread([r.ratio('after') for r in rs])} "
            f"| {spread([r.bracketed() for r in rs])} "
            f"| {spread([r.bracketed('cpu_per_step_s') for r in rs])} "
            f"| {queue} | {others} |"
        )
    lines += [
        "",
        f"**What attach takes** (`--seconds {args.seconds}`; CPU seconds, median over the "
        "repeats; a share of one core over attach's whole life)",
        "",
        "| job | rate | attach's wall | attach's Python | py-spy | all | of one core "
        "| py-spy per s of window | samples (of rate x window) | findings |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for model, rate in configs:
        rs = [r for r in runs if (r.model, r.rate) == (model, rate)]
        wall = statistics.median(r.attach_wall_s for r in rs)
        own = statistics.median(r.attach_own_cpu_s for r in rs)
        spy = statistics.median(r.attach_children_cpu_s for r in rs)
        total = statistics.median(r.attach_total_cpu_s for r in rs)
        core = statistics.median(r.attach_total_cpu_s / r.attach_wall_s for r in rs)
        samples = median([r.samples for r in rs])
        got = "n/a" if samples is None else f"{samples:.0f} ({samples / (rate * args.seconds):.0%})"
        findings = ", ".join(sorted({f for r in rs for f in r.findings}))
        lines.append(
            f"| {model} | {rate} | {wall:.2f} s | {own:.2f} s | {spy:.2f} s | {total:.2f} s "
            f"| {core:.1%} | {spy / args.seconds:.1%} | {got} | {findings} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", default="small,large", help="attach_job.py's models")
    parser.add_argument("--rates", default="50,100", help="attach --rate values")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--before", type=float, default=7.0, help="seconds before attach")
    parser.add_argument("--seconds", type=int, default=10, help="attach --seconds")
    parser.add_argument("--after", type=float, default=7.0, help="seconds after attach")
    parser.add_argument("--warmup", type=float, default=0.5, help="job's training before 'ready'")
    parser.add_argument("--quick", action="store_true", help="1 repeat, phases of 5, 6, 5 s")
    parser.add_argument(
        "--same-core",
        action="store_true",
        help="pin the job and attach (py-spy too) to one core: a machine with none to spare",
    )
    parser.add_argument("--raw", metavar="FILE", help="also write every run's figures as JSON")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.before, args.seconds, args.after = 1, 5.0, 6, 5.0
    args.same_core = max(os.sched_getaffinity(0)) if args.same_core else None
    import trainmedic

    for tree in (Path(trainmedic.__file__).resolve().parent, HERE):
        compileall.compile_dir(tree, quiet=1)  # no run compiles modules while it is timed
    configs = [(m, int(r)) for r in args.rates.split(",") for m in args.models.split(",")]
    load_start, began, ticks = os.getloadavg(), time.monotonic(), cpu_ticks()
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="trainmedic-attach-cost-") as tmp:
        for repeat in range(args.repeats):
            for model, rate in configs if repeat % 2 == 0 else configs[::-1]:
                run = one_run(model, rate, repeat, args, Path(tmp))
                runs.append(run)
                print(
                    f"{model} rate {rate} #{repeat + 1} (load {run.load:.2f}): "
                    f"{run.phases['before'].steps_per_s:.1f} steps/s before, "
                    f"during/before {run.ratio('during'):.3f}, "
                    f"after/before {run.ratio('after'):.3f}, "
                    f"attach CPU {run.attach_total_cpu_s:.2f} s",
                    file=sys.stderr,
                )
    load_end, ticks_end = os.getloadavg(), cpu_ticks()
    steal = (ticks_end[7] - ticks[7]) / max(1, sum(ticks_end[:8]) - sum(ticks[:8]))
    loads = "/".join(f"{v:.2f}" for v in load_start), "/".join(f"{v:.2f}" for v in load_end)
    print(f"command: python benchmarks/attach_cost.py {shlex.join(sys.argv[1:])}".rstrip())
    print(
        f"phases: {args.before:g} s before, attach --seconds {args.seconds} (its whole life), "
        f"{args.after:g} s after; {args.repeats} repeat(s) per job and rate, alternating"
        + ("" if args.same_core is None else f"; job and attach both on CPU {args.same_core}")
    )
    print(
        f"machine: {len(os.sched_getaffinity(0))} usable cores, {os.cpu_count()} CPUs; "
        f"Python {platform.python_version()}, torch {version('torch')}, "
        f"py-spy {version('py-spy')}; load average (1/5/15 min) {loads[0]} at the start, "
        f"{loads[1]} at the end; steal {steal:.1%} of the CPU time; "
        f"{time.monotonic() - began:.0f} s in all"
    )
    print()
    print("\n".join(report(runs, args)))
    if args.raw:
        Path(args.raw).write_text(json.dumps([asdict(r) for r in runs], indent=1))


if __name__ == "__main__":
    main()
