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

Both run the hooks as under ``trainmedic run`` but without the probe's
threads (stack sampling and sending), which are measured by
``probe_overhead.py``; the steps go into a shared-memory ring as once the
supervisor took it (``--disable ring``: queued for the probe's thread instead).

    python benchmarks/probe_instructions.py [--models tiny,mlp,deep] [--disable PART,...]
        [--by-function] [--valgrind] [--steps 680]

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


def instructions(mode: str, model: str, steps: int) -> float:
    """User-space instructions per step of the whole process, counted by callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        argv = [
            "valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
            sys.executable, __file__, "--child", mode, model, str(steps),
        ]  # fmt: skip
        pipe = subprocess.PIPE
        proc = subprocess.Popen(
            argv, stdin=pipe, stdout=pipe, stderr=subprocess.DEVNULL, text=True
        )
        assert proc.stdin is not None and proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
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
    match = re.search(r"([\d,]+)\s+\(100\.0%\)\s+PROGRAM TOTALS", report) or re.search(
        r"([\d,]+)\s+PROGRAM TOTALS", report
    )
    if match is None:
        raise RuntimeError("callgrind reported no totals")
    return int(match.group(1).replace(",", "")) / steps


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", default="tiny,mlp,deep,transformer")
    parser.add_argument("--steps", type=int, default=680)
    parser.add_argument("--valgrind", action="store_true")
    parser.add_argument("--by-function", action="store_true")
    parser.add_argument("--disable", default="", help="probe parts to leave off, comma-separated")
    args = parser.parse_args()
    models = args.models.split(",")
    if args.valgrind:
        print("| model | instructions / step, plain | with the probe's hooks | probe |")
        print("|---|---|---|---|")
        for model in models:
            plain = instructions("plain", model, args.steps)
            probed = instructions("probed", model, args.steps)
            print(
                f"| {model} | {plain:,.0f} | {probed:,.0f} "
                f"| {probed - plain:+,.0f} ({(probed - plain) / plain:+.2%}) |",
                flush=True,
            )
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
                subprocess.run(
                    [sys.executable, __file__, "--one", model, str(args.steps), mode, args.disable],
                    capture_output=True, text=True, check=True,
                ).stdout
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
