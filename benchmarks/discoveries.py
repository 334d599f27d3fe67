"""How often the forward watch rediscovers and switches, by step length, under ``trainmedic run``.

Each discovery changes ``nn.Module`` twice and each window of the compute
hooks changes the root classes twice (docs/run.md, "Time inside a step"):
on Python 3.13 and later both spend the classes' attribute-cache version tags
(``benchmarks/type_versions.py``). This runs the ``mlp`` job of
``bench_models`` for ``--seconds`` under ``trainmedic run`` with a sleep after
each step (steps of about ``--step-ms``) and prints the steps, discoveries and
windows the probe counted, and the changes it made to each class.

    python benchmarks/discoveries.py [--step-ms 0,4,9,15] [--seconds 20]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def job(sleep_s: float, seconds: float) -> None:
    """The job side: runs inside ``trainmedic run`` and prints one ``DISC`` line."""
    sys.path.insert(0, str(HERE))
    import torch
    from bench_models import build

    from trainmedic.probe import runtime

    torch.set_num_threads(1)
    bench = build("mlp")
    probe = runtime.current()
    start = time.perf_counter()
    steps = 0
    while time.perf_counter() - start < seconds:
        for x, y in bench.loader:
            bench.step(x, y)
            steps += 1
            if sleep_s:
                time.sleep(sleep_s)
            if time.perf_counter() - start >= seconds:
                break
    watch = probe.forward if probe is not None else None
    detail = probe.detail if probe is not None else None
    print("DISC " + json.dumps({
        "steps": steps,
        "discoveries": watch.discoveries if watch else None,
        "windows": detail.windows if detail else None,
        "changes": {c.__name__: n for c, n in watch.changes.items()} if watch else None,
    }), flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--step-ms", default="0,4,9,15", help="sleeps after each step, ms")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--job", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job is not None:
        job(args.job, args.seconds)
        return
    print("| sleep after each step | steps | discoveries | windows | changes by class |")
    print("|---|---|---|---|---|")
    for ms in (float(m) for m in args.step_ms.split(",")):
        with tempfile.TemporaryDirectory(prefix="trainmedic-disc-") as tmp:
            done = subprocess.run(
                [sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html",
                 "--out", str(Path(tmp) / "run"), "--", sys.executable, __file__,
                 "--job", str(ms / 1000), "--seconds", str(args.seconds)],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
        line = next((x for x in done.stdout.splitlines() if x.startswith("DISC ")), None)
        if line is None:
            sys.exit(f"the job printed no result (exit {done.returncode}):\n{done.stderr[-2000:]}")
        got = json.loads(line[5:])
        print(
            f"| {ms:g} ms | {got['steps']} | {got['discoveries']} | {got['windows']} | "
            f"{', '.join(f'{k} {v}' for k, v in sorted(got['changes'].items()))} |"
        )


if __name__ == "__main__":
    main()
