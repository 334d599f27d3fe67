"""What the whole probe costs a training step, paired within one process under ``trainmedic run``.

``overhead.py`` compares separate processes, and on a shared VM the
machine's speed drifts by ±15 % between two runs a few seconds apart: more
than the probe costs. This runs one job of ``bench_models`` under a real
``trainmedic run`` and alternates, second by second, phases with the probe's
torch hooks installed (steps tracked, queued, sent to the supervisor, stack
samples taken while it waits for data: everything the probe does per step)
and phases with them removed (the probe's thread then has nothing to send;
the supervisor still runs). A drift of the machine's speed then hits both
phases of a round alike. Each phase's first :data:`SETTLE_S` is left out of
its timing: the hooks' warm-up and forward discovery after an install, and
the last send of the steps a hooked phase left queued, fall there.

Per round, the ratio of the hooked phase's mean step to the unhooked one's
(and the same for median steps); printed: their medians over the rounds with
a 90 % bootstrap interval, and the spread. ``--control`` removes the hooks in
both phases: the ratio it prints is the method's own noise (1.000 when
nothing differs).

What this leaves out is the supervisor's cost that does not depend on the
steps (host and GPU sampling once a second, on another core), which both
phases pay, and the probe's start-up, paid once per process.

    python benchmarks/probe_ab.py [--model mlp] [--rounds 40] [--phase-s 1.0] [--control]
        [--disable PART,...] [--toggle hooks|queue]

``--toggle queue`` keeps the hooks in and alternates phases whose finished
steps are queued (sent by the probe's thread, read by the supervisor) with
phases that drop them: what the per-step record path costs beyond the hooks.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETTLE_S = 0.3
"""Seconds at the start of each phase left out of its timing."""


def job(args: argparse.Namespace) -> None:
    """The job side: runs inside ``trainmedic run`` and prints one ``AB`` line."""
    import torch

    sys.path.insert(0, str(HERE))
    from bench_models import build

    from trainmedic.probe import runtime, torch_hooks

    probe = runtime.current()
    if probe is None or probe.torch is None:
        sys.exit("probe_ab.py --job: run under trainmedic run (the driver does)")
    torch.set_num_threads(1)
    bench = build(args.model)
    installed = True

    queue_limit = runtime.MAX_OUTBOX

    def switch(on: bool) -> None:
        nonlocal installed
        if args.toggle == "queue":
            # The hooks stay in; only whether finished steps are queued (and so sent
            # and read by the supervisor) changes: a full outbox drops them.
            runtime.MAX_OUTBOX = queue_limit if on else 0
            return
        if on and not installed:
            probe._install_torch(torch)
        elif not on and installed:
            torch_hooks.uninstall(probe)
        installed = on

    clock = time.perf_counter
    batches = iter(bench.loader)

    def phase(seconds: float) -> list[float]:
        """Step times (s) after the phase's first SETTLE_S, for ``seconds`` in all."""
        nonlocal batches
        start = last = clock()
        times = []
        while last - start < seconds:
            try:
                x, y = next(batches)
            except StopIteration:
                batches = iter(bench.loader)
                x, y = next(batches)
            bench.step(x, y)
            now = clock()
            if last - start >= SETTLE_S:
                times.append(now - last)
            last = now
        return times

    phase(2.0)  # warm-up, hooked (as installed at torch's import)
    rounds = []
    for r in range(args.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        got = {}
        for hooked in order:
            switch(hooked and not args.control)
            got[hooked] = phase(args.phase_s)
        rounds.append(
            {
                "on_mean": statistics.fmean(got[True]),
                "off_mean": statistics.fmean(got[False]),
                "on_median": statistics.median(got[True]),
                "off_median": statistics.median(got[False]),
                "on_steps": len(got[True]),
            }
        )
    switch(True)
    print("AB " + json.dumps(rounds), flush=True)


def main() -> None:
    from overhead import interval  # this script's directory is on sys.path

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--phase-s", type=float, default=1.0, help="seconds per phase")
    parser.add_argument("--control", action="store_true", help="no hooks in either phase")
    parser.add_argument("--disable", default="", help="probe parts to leave off, comma-separated")
    parser.add_argument(
        "--toggle",
        choices=("hooks", "queue"),
        default="hooks",
        help="what the phases differ by: the hooks installed or removed (default), or, with"
        " the hooks in, the finished steps queued to be sent or dropped",
    )
    parser.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 1 or args.phase_s <= SETTLE_S:
        parser.error(f"--rounds must be at least 1 and --phase-s over {SETTLE_S}")
    if args.job:
        job(args)
        return
    argv = [sys.executable, __file__, "--job", "--model", args.model, "--rounds",
            str(args.rounds), "--phase-s", str(args.phase_s)]  # fmt: skip
    if args.control:
        argv.append("--control")
    argv += ["--toggle", args.toggle]
    env = dict(os.environ)
    if args.disable:
        env["TRAINMEDIC_PROBE_DISABLE"] = args.disable
    with tempfile.TemporaryDirectory(prefix="trainmedic-ab-") as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html",
             "--out", str(Path(tmp) / "run"), "--", *argv],
            capture_output=True, text=True, env=env, check=False,
        )  # fmt: skip
    line = next((x for x in done.stdout.splitlines() if x.startswith("AB ")), None)
    if line is None:
        sys.exit(f"the job printed no result (exit {done.returncode}):\n{done.stderr[-2000:]}")
    rounds = json.loads(line[3:])
    means = [r["on_mean"] / r["off_mean"] for r in rounds]
    medians = [r["on_median"] / r["off_median"] for r in rounds]
    off = statistics.median(r["off_mean"] for r in rounds)
    what = (
        "control (no hooks in either phase)"
        if args.control
        else "steps queued / dropped (hooks on in both)"
        if args.toggle == "queue"
        else "hooks on / hooks off"
    )
    print(
        f"{args.model}: {len(rounds)} rounds of {args.phase_s:g} s phases, "
        f"{statistics.median(r['on_steps'] for r in rounds):.0f} timed steps a phase, "
        f"unhooked step {off * 1e3:.3f} ms; {what}"
    )
    for name, ratios in (("mean step", means), ("median step", medians)):
        low, high = interval(ratios)
        print(
            f"  {name}: ratio {statistics.median(ratios):.4f} (90 % interval "
            f"{low:.4f}..{high:.4f}; rounds {min(ratios):.3f}..{max(ratios):.3f})"
        )


if __name__ == "__main__":
    main()
