"""What ``trainmedic run`` costs a training job, next to ``torch.profiler``; and doctor's time.

Each job of ``bench_models`` (``overhead_job.py --model NAME``: the 0.7 ms
MLP, the 3.5 ms deep network, the transformer with ~300 module calls a step)
runs as a plain process, under ``trainmedic run --quiet --no-html`` and under
``torch.profiler``, in rounds that interleave the three (the order rotates
each round), so a machine whose load drifts affects them alike. Each job times
its own training loop; the table gives per-step times and their ratios to
plain, each round's run to the same round's plain run, as medians over the
rounds with a 90 % bootstrap interval of that median (how far the median
itself can be trusted: on a shared VM a single round moves by ±15 %), the
spread of the per-round ratios (lowest..highest), and the training thread's
and the whole job process's CPU per step (CPU time is far less disturbed by
other users of the machine than wall time). The supervisor's CPU is read with
psutil from the ``trainmedic run`` process itself (user + system time) while
the job runs, as a share of one core; the whole-lifetime share (with start-up,
diagnosis and report) is given too. The supervisor is polled every
:data:`POLL_S` (one poll costs about 1 ms of CPU, which only the supervised
modes would pay: polled often, it would be part of what is measured). Every
source tree is byte-compiled first, so that no mode compiles modules during
its loop (``PYTHONDONTWRITEBYTECODE`` would otherwise make every run do it).

``trainmedic doctor`` (no data checks) is timed as a whole command, median
of several runs.

    python benchmarks/overhead.py [--models mlp,deep,transformer] [--rounds 7]
        [--seconds 4] [--doctor-runs 7] [--ablate] [--no-profiler]

``--models handoff`` (``bench_models``) runs a sample store
(``tests/e2e/scripts/sample_store.py``, answering after ``--store-latency-ms``)
for the rounds of that job, in a process of its own.

``--baseline-src DIR`` adds ``trainmedic run`` from another source tree
(``git archive <commit> src | tar -x -C DIR``, then ``DIR/src``), interleaved
with the rest: before and after a change, in the same rounds.

``--ablate`` adds, to find where an overhead goes, runs under ``trainmedic
run --no-probe`` (the supervisor alone) and runs with one probe part switched
off at a time (``TRAINMEDIC_PROBE_DISABLE=<part>``; ``--ablate-parts`` picks
them). ``--split`` adds the supervisor alone, the hooks alone (the probe's
thread and stack sampler off: nothing is sent), the probe's thread alone (the
hooks off) and everything but the stack sampler. ``--seconds`` sets each
job's loop length from a first timing of its step.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
JOB = HERE / "overhead_job.py"
POLL_S = 0.5
ABLATED_PARTS = ("stacks", "forward", "backward", "loader", "heartbeat", "steps")
"""Probe parts switched off one at a time by ``--ablate`` (names from ``probe.parts``)."""


@dataclass(frozen=True)
class Mode:
    """How a job is run: ``plain``, ``profiler`` or ``run`` (with flags and environment)."""

    name: str
    kind: str
    flags: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()


MODES = (
    Mode("plain", "plain"),
    Mode("trainmedic run", "run"),
    Mode("torch.profiler", "profiler"),
)

HOOK_PARTS = "steps,backward,forward,loader"
"""The probe parts that hook the job's calls (``probe.parts``)."""
SPLIT_MODES = (
    Mode("trainmedic run --no-probe", "run", ("--no-probe",)),
    Mode(
        "hooks alone (no probe thread, nothing sent)",
        "run",
        env=(("TRAINMEDIC_PROBE_DISABLE", "sending,stacks"),),
    ),
    Mode(
        "probe thread alone (no hooks)",
        "run",
        env=(("TRAINMEDIC_PROBE_DISABLE", HOOK_PARTS),),
    ),
    Mode(
        "without the stack sampler",
        "run",
        env=(("TRAINMEDIC_PROBE_DISABLE", "stacks"),),
    ),
)
"""``--split``: the supervisor alone, the hooks alone, the probe's thread alone, and
everything but the stack sampler - where ``trainmedic run``'s cost goes."""


def ablation_modes(parts: tuple[str, ...] = ABLATED_PARTS) -> tuple[Mode, ...]:
    """``--no-probe``, then the probe without each of ``parts`` in turn (``a+b``: the
    parts ``a`` and ``b`` off together)."""
    return (
        Mode("trainmedic run --no-probe", "run", ("--no-probe",)),
        *(
            Mode(
                f"trainmedic run, probe without {part.replace('+', ' and ')}",
                "run",
                env=(("TRAINMEDIC_PROBE_DISABLE", part.replace("+", ",")),),
            )
            for part in parts
        ),
    )


def baseline_modes(src: str) -> tuple[Mode, ...]:
    """``trainmedic run`` with the trainmedic package under ``src`` (``--baseline-src``),
    or none when ``src`` is empty."""
    if not src:
        return ()
    path = Path(src).resolve()
    if not (path / "trainmedic" / "__init__.py").is_file():
        # Else PYTHONPATH would point nowhere and the "baseline" be this checkout.
        raise SystemExit(f"--baseline-src {src}: no trainmedic package in that directory")
    return (Mode("trainmedic run, baseline", "run", env=(("PYTHONPATH", str(path)),)),)


def compile_trees(baseline_src: str = "") -> None:
    """Byte-compile trainmedic, the benchmarks and the baseline's tree before the rounds,
    so that no mode's first round pays for compiling them."""
    import trainmedic

    trees = [Path(trainmedic.__file__).resolve().parent, HERE]
    if baseline_src:
        trees.append(Path(baseline_src).resolve())
    for tree in trees:
        compileall.compile_dir(tree, quiet=1)


@dataclass
class Sample:
    """One job's loop and, under trainmedic, its supervisor's CPU."""

    step_mean_s: float
    step_median_s: float
    thread_cpu_s: float
    process_cpu_s: float
    switches: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """Per second of the loop: the training thread blocked, it was preempted, the
    job's other threads woke (``overhead_job.py``'s counts)."""
    supervisor_cpu_during_job: float | None = None
    supervisor_cpu_lifetime: float | None = None
    supervisor_reported: float | None = None
    probe_threads: float | None = None
    outside_sampler: float | None = None
    """py-spy's CPU sampling the job from outside (``stacks_outside``), share of a core."""


@dataclass
class Results:
    model: str
    steps: int
    samples: dict[str, list[Sample]] = field(default_factory=dict)


def bench_line(stdout: str) -> dict[str, float]:
    for line in stdout.splitlines():
        if line.startswith("BENCH "):
            data: dict[str, float] = json.loads(line[6:])
            return data
    raise RuntimeError(f"the job printed no BENCH line:\n{stdout[-2000:]}")


def run_plain(job_args: list[str], profiler: bool) -> Sample:
    argv = [sys.executable, str(JOB), *job_args] + (["--profiler"] if profiler else [])
    got = subprocess.run(argv, capture_output=True, text=True, check=True)
    b = bench_line(got.stdout)
    return Sample(
        b["step_mean_s"],
        b["step_median_s"],
        b["thread_cpu_per_step_s"],
        b["process_cpu_per_step_s"],
        _switches(b),
    )


def _switches(bench: dict[str, float]) -> tuple[float, float, float]:
    return (
        bench.get("train_blocked_per_s", 0.0),
        bench.get("train_preempted_per_s", 0.0),
        bench.get("other_wakes_per_s", 0.0),
    )


def run_supervised(job_args: list[str], run_dir: Path, mode: Mode) -> Sample:
    """Run the job under ``trainmedic run`` and watch the supervisor with psutil."""
    argv = [
        sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html", *mode.flags,
        "--out", str(run_dir), "--", sys.executable, str(JOB), *job_args,
    ]  # fmt: skip
    env = dict(os.environ, **dict(mode.env))
    started = time.perf_counter()
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env
    )
    supervisor = psutil.Process(proc.pid)
    job_first: tuple[float, float] | None = None
    job_last: tuple[float, float] | None = None
    last_cpu = 0.0
    while proc.poll() is None:
        try:
            times = supervisor.cpu_times()
            cpu = times.user + times.system
            job_running = bool(supervisor.children())
        except psutil.Error:
            break
        now = time.perf_counter()
        last_cpu = cpu
        if job_running:
            job_first = job_first or (now, cpu)
            job_last = (now, cpu)
        time.sleep(POLL_S)
    stdout, _ = proc.communicate()
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"trainmedic run failed with {proc.returncode}")
    b = bench_line(stdout)
    during = None
    if job_first and job_last and job_last[0] > job_first[0]:
        during = (job_last[1] - job_first[1]) / (job_last[0] - job_first[0])
    return Sample(
        b["step_mean_s"],
        b["step_median_s"],
        b["thread_cpu_per_step_s"],
        b["process_cpu_per_step_s"],
        _switches(b),
        supervisor_cpu_during_job=during,
        supervisor_cpu_lifetime=last_cpu / wall,
        supervisor_reported=reported_usage(run_dir),
        probe_threads=probe_usage(run_dir),
        outside_sampler=outside_usage(run_dir),
    )


def reported_usage(run_dir: Path) -> float | None:
    """The supervisor's own account (event ``supervisor_usage``): CPU s / wall s."""
    try:
        lines = (run_dir / "events.jsonl").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        event = json.loads(line)
        if event.get("kind") == "supervisor_usage":
            data = event.get("data", {})
            return float(data["cpu_s"]) / max(1e-9, float(data["wall_s"]))
    return None


def outside_usage(run_dir: Path) -> float | None:
    """py-spy's CPU seconds sampling the job from outside (event ``stacks_outside``,
    state ``usage``) over the supervisor's wall seconds (``supervisor_usage``)."""
    try:
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    except OSError:
        return None
    cpu = wall = None
    for event in events:
        data = event.get("data", {})
        if event.get("kind") == "stacks_outside" and data.get("state") == "usage":
            cpu = float(data["cpu_s"])
        elif event.get("kind") == "supervisor_usage":
            wall = float(data["wall_s"])
    return None if cpu is None or not wall else cpu / wall


def steps_for(model: str, threads: int, seconds: float) -> int:
    """Steps that make a loop of about ``seconds``, from a short plain run."""
    probe = run_plain(["--model", model, "--steps", "40", "--threads", str(threads)], False)
    return max(100, int(seconds / probe.step_mean_s))


def probe_usage(run_dir: Path) -> float | None:
    """The probe threads' CPU as a share of one core, from the job's ``process_exit``
    events (their ``probe_cpu_s`` / ``probe_wall_s``), all processes together."""
    try:
        lines = (run_dir / "events.jsonl").read_text().splitlines()
    except OSError:
        return None
    cpu = wall = 0.0
    for line in lines:
        event = json.loads(line)
        data = event.get("data") or {}
        if event.get("kind") == "process_exit" and "probe_cpu_s" in data:
            cpu += float(data["probe_cpu_s"])
            wall += float(data.get("probe_wall_s") or 0.0)
    return cpu / wall if wall > 0 else None


def overhead(
    model: str, rounds: int, seconds: float, threads: int, modes: tuple[Mode, ...]
) -> Results:
    steps = steps_for(model, threads, seconds)
    job_args = ["--model", model, "--steps", str(steps), "--threads", str(threads)]
    results = Results(model, steps, {m.name: [] for m in modes})
    with tempfile.TemporaryDirectory(prefix="trainmedic-bench-") as tmp:
        for r in range(rounds):
            k = r % len(modes)
            for i, mode in enumerate(modes[k:] + modes[:k]):
                if mode.kind == "run":
                    s = run_supervised(job_args, Path(tmp) / f"run-{r}-{i}", mode)
                else:
                    s = run_plain(job_args, profiler=mode.kind == "profiler")
                results.samples[mode.name].append(s)
                print(
                    f"{model} round {r + 1} {mode.name}: {s.step_mean_s * 1e3:.3f} ms/step",
                    file=sys.stderr,
                )
    return results


@contextlib.contextmanager
def store_for(model: str, latency_ms: float) -> Iterator[None]:
    """The sample store the ``handoff`` job fetches from, its address in ``BENCH_STORE``."""
    if model != "handoff":
        yield
        return
    sys.path.insert(0, str(HERE.parent / "tests" / "e2e"))
    from corpus import sample_store  # the corpus's store: the same process, the same wire

    with sample_store(latency_ms / 1000.0) as address:
        os.environ["BENCH_STORE"] = address
        try:
            yield
        finally:
            os.environ.pop("BENCH_STORE", None)


def doctor_times(runs: int) -> list[float]:
    argv = [sys.executable, "-m", "trainmedic", "doctor"]
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        out.append(time.perf_counter() - t0)
    return out


def median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def report(results: list[Results], doctor: list[float], args: argparse.Namespace) -> str:
    lines: list[str] = []
    if results:
        lines += [
            f"rounds: {args.rounds}, torch threads: {args.threads}, "
            f"usable cores: {len(os.sched_getaffinity(0))}; medians over rounds, "
            "spread = lowest..highest per-round ratio",
            "",
        ]
        for r in results:
            lines += overhead_table(r)
    if doctor:
        lines += [
            "",
            f"`trainmedic doctor` wall time over {len(doctor)} runs: median "
            f"{statistics.median(doctor):.2f} s, min {min(doctor):.2f} s, max {max(doctor):.2f} s",
        ]
    return "\n".join(lines)


def interval(values: list[float], level: float = 0.9, resamples: int = 2000) -> tuple[float, float]:
    """A bootstrap interval of the median of ``values`` (seeded: the same rounds give
    the same interval)."""
    rng = random.Random(0)
    medians = sorted(
        statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples)
    )
    tail = (1.0 - level) / 2.0
    return medians[int(tail * resamples)], medians[int((1.0 - tail) * resamples) - 1]


def overhead_table(results: Results) -> list[str]:
    plain = results.samples["plain"]
    base_mean = statistics.median(s.step_mean_s for s in plain)
    base_median = statistics.median(s.step_median_s for s in plain)
    base_thread = statistics.median(s.thread_cpu_s for s in plain)
    base_process = statistics.median(s.process_cpu_s for s in plain)
    lines = [
        f"**{results.model}** ({results.steps} steps per job, plain step "
        f"{base_mean * 1e3:.3f} ms mean, {base_median * 1e3:.3f} ms median)",
        "",
        "| mode | ratio to plain, mean step (90 % interval) | spread "
        "| ratio to plain, median step (90 % interval) "
        "| training thread CPU / step vs plain | job process CPU / step vs plain "
        "| training thread blocked, preempted / s | other threads' wake-ups / s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode, samples in results.samples.items():
        if mode == "plain":
            lines.append(
                "| plain | 1 | | 1 | | | "
                + ", ".join(
                    f"{statistics.median(s.switches[i] for s in samples):.1f}" for i in (0, 1)
                )
                + f" | {statistics.median(s.switches[2] for s in samples):.1f} |"
            )
            continue
        pairs = list(zip(samples, plain, strict=True))
        ratios = [s.step_mean_s / p.step_mean_s for s, p in pairs]
        medians = [s.step_median_s / p.step_median_s for s, p in pairs]
        low, high = interval(ratios)
        med_low, med_high = interval(medians)
        blocked, preempted, wakes = (
            statistics.median(s.switches[i] for s in samples) for i in range(3)
        )
        thread = statistics.median(s.thread_cpu_s for s in samples) - base_thread
        process = statistics.median(s.process_cpu_s for s in samples) - base_process
        lines.append(
            f"| {mode} | {statistics.median(ratios):.3f} ({low:.3f}..{high:.3f}) "
            f"| {min(ratios):.3f}..{max(ratios):.3f} "
            f"| {statistics.median(medians):.3f} ({med_low:.3f}..{med_high:.3f}) "
            f"| {thread * 1e6:+.1f} µs ({thread / base_thread:+.2%}) "
            f"| {process * 1e6:+.1f} µs ({process / base_process:+.2%}) "
            f"| {blocked:.1f}, {preempted:.1f} | {wakes:.1f} |"
        )
    sup = results.samples.get("trainmedic run", [])
    during = median([s.supervisor_cpu_during_job for s in sup])
    lifetime = median([s.supervisor_cpu_lifetime for s in sup])
    reported = median([s.supervisor_reported for s in sup])
    threads = median([s.probe_threads for s in sup])
    outside = median([s.outside_sampler for s in sup])
    lines += [
        "",
        f"Supervisor CPU, % of one core: {_pct(during)} while the job runs (psutil), "
        f"{_pct(lifetime)} over its whole life (start-up, diagnosis, report), "
        f"{_pct(reported)} by its own account (`supervisor_usage`). The probe's own "
        f"threads in the job (sending, heartbeats, stack sampling): {_pct(threads)} "
        "of one core (`process_exit` events). py-spy sampling the job from outside "
        f"(`stacks_outside`): {_pct(outside)} of one core.",
    ]
    if set(results.samples) - {m.name for m in MODES}:
        lines += ["", "Supervisor CPU while the job runs, per mode (median):", ""]
        for mode, samples in results.samples.items():
            if samples and samples[0].supervisor_cpu_during_job is not None:
                lines.append(
                    f"- {mode}: {_pct(median([s.supervisor_cpu_during_job for s in samples]))}"
                )
    lines.append("")
    return lines


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.2f} %"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", default="mlp,deep,transformer")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seconds", type=float, default=4.0, help="each job's loop")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--doctor-runs", type=int, default=7)
    parser.add_argument("--ablate", action="store_true", help="also runs that find where it goes")
    parser.add_argument(
        "--split", action="store_true", help="also the supervisor, hooks and threads alone"
    )
    parser.add_argument(
        "--ablate-parts",
        default=",".join(ABLATED_PARTS),
        help="with --ablate: the probe parts switched off one at a time (comma list)",
    )
    parser.add_argument("--baseline-src", help="a source tree whose trainmedic run to compare")
    parser.add_argument(
        "--store-latency-ms", type=float, default=1.0, help="the handoff job's sample store"
    )
    parser.add_argument(
        "--no-profiler", action="store_true", help="no torch.profiler runs"
    )
    args = parser.parse_args()
    base = tuple(m for m in MODES if not (args.no_profiler and m.kind == "profiler"))
    parts = tuple(p for p in args.ablate_parts.split(",") if p)
    modes = base + (ablation_modes(parts) if args.ablate else ())
    modes += tuple(m for m in SPLIT_MODES if args.split and m not in modes)

    modes += baseline_modes(args.baseline_src)
    compile_trees(args.baseline_src)
    results = []
    if args.rounds > 0:
        for model in args.models.split(","):
            with store_for(model, args.store_latency_ms):
                results.append(overhead(model, args.rounds, args.seconds, args.threads, modes))
    doctor = doctor_times(args.doctor_runs) if args.doctor_runs > 0 else []
    print(report(results, doctor, args))


if __name__ == "__main__":
    main()
