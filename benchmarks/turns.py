"""What ``trainmedic run`` costs a job, with the modes taking turns on the machine.

Why: on a shared VM the machine's speed moves by 10-50 % from one second to
the next (a neighbour on the same physical core), so jobs run one after the
other (``overhead.py``) differ by more than the few percent being measured.
Here the jobs of one round - the plain job, the job under ``trainmedic run``
and under ``trainmedic run --no-probe`` - are all started, then take turns:
in its turn a mode runs for ``--slice`` seconds while the others are stopped
(``SIGSTOP`` of every process of that mode: the job, and under trainmedic the
supervisor, its output keeper, session holder and py-spy too, so that during
the plain job's turn nothing of trainmedic runs). A cycle gives every mode one
turn, in an order drawn anew each cycle (seeded), ``--cycles`` of them, so the
modes meet the same machine within a second or two of each other. Each job
times its own steps (``overhead_job.py --stamps-out``: each step's end on the
system's monotonic clock); a step counts when it began and ended inside one of
its mode's turns, after the first ``--settle`` seconds of the turn (the caches
the other jobs cooled).

Each round is a fresh set of processes (memory layout differs process to
process). The table gives, per mode, the round's mean step over all counted
steps as a ratio to the same round's plain job, the median of those ratios
over the rounds with a 90 % bootstrap interval, their spread, and the median
of the per-turn ratios (each turn against the plain job's turn of the same
cycle) with its interval.

    python benchmarks/turns.py [--models mlp,deep] [--rounds 10] [--cycles 20]
        [--slice 0.5] [--settle 0.1] [--threads 1] [--split] [--ablate-parts a,b]
        [--session] [--floor] [--baseline-src DIR]

``--split`` adds ``overhead.py``'s split of the probe (the hooks alone, the
probe's thread alone, everything but the stack sampler); ``--ablate-parts``
adds runs with one probe part off at a time (``TRAINMEDIC_PROBE_DISABLE``).

The job itself is unchanged by this: it runs its loop, ``trainmedic run`` runs
as a user runs it (``--quiet --no-html``); the pauses are shorter than any hang
timeout (20 s at least), so the supervisor sees a job whose steps stop and
resume, which makes the probe's thread wake once a turn (docs/performance.md).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from overhead import (
    JOB,
    SPLIT_MODES,
    Mode,
    ablation_modes,
    baseline_modes,
    compile_trees,
    interval,
)

TURN_MODES = (
    Mode("plain", "plain"),
    Mode("trainmedic run", "run"),
    Mode("trainmedic run --no-probe", "run", ("--no-probe",)),
)
FLOOR_MODE = Mode("plain, two bare hooks in the job", "plain", (), (("OVERHEAD_JOB_FLOOR", "1"),))
"""``--floor``: the plain job with the least a per-step probe adds at trainmedic's two
per-step call sites (``overhead_job.install_floor_hooks``): the floor of any Python
hook there, to weigh trainmedic's own against."""
SESSION_MODE = Mode("plain, in a session of its own", "session")
"""``--session``: the plain job started as ``trainmedic run`` starts a job (``setsid``:
a session, and with the kernel's autogroups a scheduling group, of its own), to
tell what the session changes from what trainmedic's code costs."""
START_TIMEOUT_S = 120.0


@dataclass
class Job:
    """One mode's processes in a round."""

    mode: Mode
    proc: subprocess.Popen[bytes]
    started: Path
    stamps: Path
    turns: list[tuple[float, float]] = field(default_factory=list)
    """``(began, ended)`` of each turn, perf_counter seconds."""
    ends: list[float] = field(default_factory=list)
    """The loop's start, then each step's end (perf_counter seconds), from the job."""


def launch(mode: Mode, job_args: list[str], tmp: Path, until: Path) -> Job:
    tag = mode.name.replace(" ", "_").replace("-", "")
    started, stamps = tmp / f"{tag}.started", tmp / f"{tag}.stamps"
    job = [
        sys.executable, str(JOB), *job_args,
        "--until", str(until), "--started", str(started), "--stamps-out", str(stamps),
    ]  # fmt: skip
    if mode.kind == "run":
        argv = [
            sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html", *mode.flags,
            "--out", str(tmp / f"{tag}.run"), "--", *job,
        ]  # fmt: skip
    else:
        argv = job
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=dict(os.environ, **dict(mode.env)),
        start_new_session=mode.kind == "session",
    )
    return Job(mode, proc, started, stamps)


def tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants (the job last: stopped last, resumed first)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def signal_all(procs: list[psutil.Process], sig: int) -> None:
    for p in procs:
        with contextlib.suppress(psutil.Error):  # a py-spy window that just ended
            p.send_signal(sig)


def one_round(
    modes: tuple[Mode, ...], job_args: list[str], cycles: int, slice_s: float, first: int
) -> list[Job]:
    with tempfile.TemporaryDirectory(prefix="trainmedic-turns-") as name:
        tmp = Path(name)
        until = tmp / "stop"
        jobs = [launch(m, job_args, tmp, until) for m in modes]
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all(j.started.exists() for j in jobs):
            if time.monotonic() > deadline or any(j.proc.poll() is not None for j in jobs):
                raise RuntimeError("a job did not start its loop")
            time.sleep(0.05)
        for j in jobs:
            signal_all(tree(j.proc.pid), signal.SIGSTOP)
        order = random.Random(first)
        for _ in range(cycles):
            # A new order every cycle: no mode always follows the same other one (the
            # one before leaves the caches and the scheduler's state to the next).
            for j in order.sample(jobs, len(jobs)):
                procs = tree(j.proc.pid)
                signal_all(list(reversed(procs)), signal.SIGCONT)
                began = time.perf_counter()
                time.sleep(slice_s)
                ended = time.perf_counter()
                signal_all(tree(j.proc.pid), signal.SIGSTOP)
                j.turns.append((began, ended))
        until.touch()
        for j in jobs:
            signal_all(list(reversed(tree(j.proc.pid))), signal.SIGCONT)
        for j in jobs:
            if j.proc.wait(timeout=START_TIMEOUT_S) != 0:
                raise RuntimeError(f"{j.mode.name} exited with {j.proc.returncode}")
        for j in jobs:
            j.ends = [float(x) for x in j.stamps.read_text().split()]
    return jobs


def counted_steps(
    stamps: list[float], turns: list[tuple[float, float]], settle_s: float
) -> list[list[float]]:
    """Per turn, the durations of the steps that began and ended inside it (after
    ``settle_s``)."""
    out: list[list[float]] = [[] for _ in turns]
    t = 0
    for a, b in itertools.pairwise(stamps):
        while t < len(turns) and a >= turns[t][1]:
            t += 1
        if t == len(turns):
            break
        began, ended = turns[t]
        if a >= began + settle_s and b <= ended:
            out[t].append(b - a)
    return out


@dataclass
class Round:
    per_turn: dict[str, list[list[float]]]

    def mean(self, mode: str) -> float:
        steps = [d for turn in self.per_turn[mode] for d in turn]
        return sum(steps) / len(steps)


def measure(
    model: str,
    modes: tuple[Mode, ...],
    rounds: int,
    cycles: int,
    slice_s: float,
    settle_s: float,
    threads: int,
) -> list[Round]:
    job_args = ["--model", model, "--threads", str(threads)]
    out = []
    for r in range(rounds):
        jobs = one_round(modes, job_args, cycles, slice_s, r)
        per_turn = {}
        for j in jobs:
            per_turn[j.mode.name] = counted_steps(j.ends, j.turns, settle_s)
        rnd = Round(per_turn)
        out.append(rnd)
        plain = rnd.mean("plain")
        print(
            f"{model} round {r + 1}: plain {plain * 1e3:.3f} ms; "
            + ", ".join(f"{m.name} {rnd.mean(m.name) / plain:.3f}" for m in modes[1:]),
            file=sys.stderr,
        )
    return out


def table(model: str, modes: tuple[Mode, ...], rounds: list[Round]) -> list[str]:
    plain = [r.mean("plain") for r in rounds]
    lines = [
        f"**{model}** (plain step {statistics.median(plain) * 1e3:.3f} ms, median of the "
        f"rounds' means; {sum(len(t) for t in rounds[0].per_turn['plain'])} steps counted "
        "in a round's plain job)",
        "",
        "| mode | mean step vs plain, median of rounds (90 % interval) | spread of rounds "
        "| per-turn ratio, median over all turns (90 % interval) |",
        "|---|---|---|---|",
    ]
    for mode in modes[1:]:
        ratios = [r.mean(mode.name) / p for r, p in zip(rounds, plain, strict=True)]
        low, high = interval(ratios)
        turn_ratios = [
            statistics.fmean(s) / statistics.fmean(p)
            for r in rounds
            for s, p in zip(r.per_turn[mode.name], r.per_turn["plain"], strict=True)
            if s and p
        ]
        t_low, t_high = interval(turn_ratios)
        lines.append(
            f"| {mode.name} | {statistics.median(ratios):.3f} ({low:.3f}..{high:.3f}) "
            f"| {min(ratios):.3f}..{max(ratios):.3f} "
            f"| {statistics.median(turn_ratios):.3f} ({t_low:.3f}..{t_high:.3f}) |"
        )
    lines.append("")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", default="mlp,deep")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--cycles", type=int, default=20, help="turns of each mode a round")
    parser.add_argument("--slice", type=float, default=0.5, help="seconds of one turn")
    parser.add_argument(
        "--settle", type=float, default=0.1, help="seconds not counted at a turn's start"
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--split", action="store_true", help="also the hooks alone, the probe's thread alone, ..."
    )
    parser.add_argument(
        "--ablate-parts",
        default="",
        help="also runs with these probe parts off, one at a time (a+b: both at once)",
    )
    parser.add_argument(
        "--session", action="store_true", help="also the plain job in a session of its own"
    )
    parser.add_argument(
        "--floor", action="store_true", help="also the plain job with two bare hooks in it"
    )
    parser.add_argument(
        "--baseline-src",
        default="",
        help="also trainmedic run with the trainmedic package under this src directory",
    )
    args = parser.parse_args()
    modes: tuple[Mode, ...] = TURN_MODES + ((SESSION_MODE,) if args.session else ())
    modes += (FLOOR_MODE,) if args.floor else ()
    parts = tuple(p for p in args.ablate_parts.split(",") if p)
    modes += tuple(m for m in ablation_modes(parts) if m not in modes)
    modes += tuple(m for m in SPLIT_MODES if args.split and m not in modes)
    modes += baseline_modes(args.baseline_src)
    compile_trees(args.baseline_src)
    lines = [
        f"rounds: {args.rounds}, {args.cycles} turns of {args.slice:g} s per mode a round "
        f"(first {args.settle:g} s of each not counted), torch threads: {args.threads}, "
        f"usable cores: {len(os.sched_getaffinity(0))}",
        "",
    ]
    for model in args.models.split(","):
        try:
            rounds = measure(
                model, modes, args.rounds, args.cycles, args.slice, args.settle, args.threads
            )
        except RuntimeError as exc:  # a job that did not start (an unknown model ...)
            raise SystemExit(f"turns.py: {model}: {exc}") from None
        lines += table(model, modes, rounds)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
