"""The probe's cost per step in counts that a busy machine cannot disturb.

Timings on a shared machine swing by more than the probe costs, so this
counts work instead, for each job of ``bench_models``:

* **bytecodes** (``--bytecodes``, the default): Python instructions executed
  per training step in the probe's own code, by function, traced with
  ``sys.settrace`` (opcode events) over 680 steps after a warm-up of 200
  (ten windows' worth of the compute hooks' schedule, docs/run.md);
* **machine instructions** (``--valgrind``): user-space instructions per
  step of the whole process, plain and with the probe's hooks, counted by
  valgrind's callgrind with instrumentation switched on only around the
  measured steps (``callgrind_control``); slow (minutes per job).
  ``--cache-sim`` adds callgrind's simulated caches (first-level instruction
  and data misses, last-level misses: what the hooks' code and objects cost
  beyond their instructions when the step's kernels have had the caches),
  several times slower again; ``--no-windows`` keeps the compute hooks off
  after the warm-up, so that only the steps between two windows are counted
  (under valgrind's slowness the windows come far more often than in a real
  job of short steps).

Both run the hooks as under ``trainmedic run`` but without the probe's
threads (stack sampling and sending), which are measured by
``probe_overhead.py``; the steps go into a shared-memory ring as once the
supervisor took it (``--disable ring``: queued for the probe's thread instead).

    python benchmarks/probe_instructions.py [--models tiny,mlp,deep] [--disable PART,...]
        [--by-function] [--valgrind [--cache-sim] [--no-windows]] [--steps 680]

Callgrind's counts are exact for the ``tiny`` job; for bigger ones the BLAS
kernels' own counts differ between processes by about 1 %, more than the
probe adds.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
NO_WINDOWS_ENV = "PROBE_INSTRUCTIONS_NO_WINDOWS"
"""Set to ``1`` in the child's environment by ``--no-windows``."""
EVENTS = ("Ir", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")
"""Callgrind's events reported with ``--cache-sim``, instructions first."""


def _job(model: str, probed: bool, disable: frozenset[str] = frozenset()) -> Any:
    sys.path.insert(0, str(HERE))
    import torch
    from bench_models import build

    torch.set_num_threads(1)
    job = build(model)
    if probed:
        from trainmedic.probe.env import ProbeConfig
        from trainmedic.probe.runtime import Probe

        off = frozenset({"stacks"}) | disable
        config = ProbeConfig("unix:/nonexistent", "x", None, off, frozenset())
        probe = Probe(config)
        # The steps are queued as in a run (the fast close of gap steps needs a
        # probe that sends), but no thread starts to send them: a thread that is
        # never started stands in for it.
        probe.failed = False
        probe._agent = threading.Thread()
        probe._install_torch(torch)
        if "ring" not in disable:
            # The steps go into a shared-memory ring, as once the supervisor took it
            # (no reader maps it here: the ring overwrites what nobody read).
            from trainmedic.channel.ring import RingWriter
            from trainmedic.probe.steprings import RingSteps

            probe.ring = RingSteps(RingWriter(), probe.wall_offset, probe.outbox)
        if probe.detail is not None:
            import random

            from trainmedic.probe import detail

            # The tracer makes every step 10-100x longer, past detail.LONG_STEP_S:
            # follow the schedule of the untraced job (its steps are all short),
            # with the same windows in every run.
            detail.LONG_STEP_S = float("inf")
            probe.detail.rng = random.Random(0)
            if os.environ.get(NO_WINDOWS_ENV) == "1":
                # After the warm-up, one gap longer than any run: no window comes.
                detail.GAP_STEPS = (10**9, 10**9)
    return job


def _loop(job: Any, steps: int) -> None:
    done = 0
    while done < steps:
        for x, y in job.loader:
            job.step(x, y)
            done += 1
            if done == steps:
                break


def bytecodes(
    model: str, steps: int, probed: bool, disable: frozenset[str] = frozenset()
) -> tuple[float, float, dict[str, float]]:
    """(all bytecodes per step, the probe's, the probe's by function)."""
    job = _job(model, probed, disable)
    _loop(job, 200)  # warm-up: discovery is over
    counts: collections.Counter[tuple[str, str]] = collections.Counter()

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        if event == "opcode":
            code = frame.f_code
            counts[(code.co_filename, code.co_name)] += 1
        return tracer

    sys.settrace(tracer)
    try:
        _loop(job, steps)
    finally:
        sys.settrace(None)
    probe = {
        f"{Path(f).name}:{name}": n / steps
        for (f, name), n in counts.items()
        if f"{os.sep}trainmedic{os.sep}probe{os.sep}" in f
    }
    return sum(counts.values()) / steps, sum(probe.values()), probe


def _child(mode: str, model: str, steps: int) -> None:
    """Inside valgrind: warm up, say ready, run ``steps`` when told, say done."""
    job = _job(model, probed=mode == "probed")
    _loop(job, 200)
    print("ready", flush=True)
    sys.stdin.readline()
    _loop(job, steps)
    print("done", flush=True)
    sys.stdin.readline()


def instructions(
    mode: str, model: str, steps: int, cache_sim: bool = False, windows: bool = True
) -> dict[str, float]:
    """Callgrind's counts per step of the whole process (user space): ``Ir``
    (instructions) and, with ``cache_sim``, the simulated caches' misses."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        argv = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
            *(["--cache-sim=yes"] if cache_sim else []),
            sys.executable, __file__, "--child", mode, model, str(steps),
        ]  # fmt: skip
        env = {**os.environ, NO_WINDOWS_ENV: "0" if windows else "1"}
        pipe = subprocess.PIPE
        proc = subprocess.Popen(
            argv, stdin=pipe, stdout=pipe, stderr=subprocess.DEVNULL, text=True, env=env
        )
        assert proc.stdin is not None and proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            proc.wait()
            raise SystemExit(f"probe_instructions.py: {model}: the job did not start")
        subprocess.run(["callgrind_control", "-i", "on", str(proc.pid)], capture_output=True)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "done"
        subprocess.run(["callgrind_control", "-i", "off", str(proc.pid)], capture_output=True)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        proc.wait()
        report = subprocess.run(
            ["callgrind_annotate", str(out)], capture_output=True, text=True, check=True
        ).stdout
    return {name: n / steps for name, n in _totals(report).items()}


def _totals(report: str) -> dict[str, int]:
    """``{event: count}`` from callgrind_annotate's header and PROGRAM TOTALS line."""
    names = re.search(r"^Events shown:\s+(.+)$", report, re.M)
    totals = next((line for line in report.splitlines() if "PROGRAM TOTALS" in line), None)
    if names is None or totals is None:
        raise RuntimeError("callgrind reported no totals")
    head = re.sub(r"\([^)]*\)", "", totals.split("PROGRAM TOTALS")[0])  # the (100.0%)s
    counts = [int(n.replace(",", "")) for n in re.findall(r"[\d,]+", head)]
    return dict(zip(names.group(1).split(), counts, strict=False))


def _one(model: str, steps: int, mode: str, disable: str) -> str:
    """The bytecode count of one run, in a fresh interpreter; a run that fails
    (an unknown model ...) ends the benchmark with its last line."""
    run = subprocess.run(
        [sys.executable, __file__, "--one", model, str(steps), mode, disable],
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["no output"])[-1]
        raise SystemExit(f"probe_instructions.py: {model}: {last}")
    return run.stdout


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", default="tiny,mlp,deep,transformer")
    parser.add_argument("--steps", type=int, default=680)
    parser.add_argument("--valgrind", action="store_true")
    parser.add_argument("--cache-sim", action="store_true", help="with --valgrind: cache misses")
    parser.add_argument(
        "--no-windows", action="store_true", help="with --valgrind: the steps between windows only"
    )
    parser.add_argument("--by-function", action="store_true")
    parser.add_argument("--disable", default="", help="probe parts to leave off, comma-separated")
    args = parser.parse_args()
    if (args.cache_sim or args.no_windows) and not args.valgrind:
        parser.error("--cache-sim and --no-windows count with --valgrind only")
    models = args.models.split(",")
    if args.valgrind:
        events = EVENTS if args.cache_sim else EVENTS[:1]
        print("| model | count / step | plain | with the probe's hooks | probe adds |")
        print("|---|---|---|---|---|")
        for model in models:
            plain, probed = (
                instructions(mode, model, args.steps, args.cache_sim, not args.no_windows)
                for mode in ("plain", "probed")
            )
            for event in events:
                a, b = plain.get(event, 0.0), probed.get(event, 0.0)
                share = f" ({(b - a) / a:+.2%})" if a else ""
                print(f"| {model} | {event} | {a:,.1f} | {b:,.1f} | {b - a:+,.1f}{share} |")
        return
    print(
        "| model | bytecodes / step, plain | with the probe's hooks | added "
        "| of which in the probe's code |"
    )
    print("|---|---|---|---|---|")
    details = []
    for model in models:
        # A fresh interpreter per run: the probe's hooks are process-wide.
        runs = [
            json.loads(
                _one(model, args.steps, mode, args.disable)
            )
            for mode in ("plain", "probed")
        ]
        (plain, _, _), (total, probe, by_function) = runs
        print(
            f"| {model} | {plain:,.0f} | {total:,.0f} | {total - plain:+,.0f} | {probe:,.0f} |",
            flush=True,
        )
        details.append((model, by_function))
    if args.by_function:
        for model, by_function in details:
            print(f"\n{model}:")
            for name, n in sorted(by_function.items(), key=lambda kv: -kv[1]):
                print(f"  {n:7.1f}  {name}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--one":
        off = frozenset(p for p in sys.argv[5].split(",") if p)
        print(json.dumps(bytecodes(sys.argv[2], int(sys.argv[3]), sys.argv[4] == "probed", off)))
    else:
        main()
