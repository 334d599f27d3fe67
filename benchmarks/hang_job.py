"""The job the restart benchmark runs: steady steps, its own checkpoints, one hang.

Each step sleeps ``--step-s`` seconds and marks itself with ``trainmedic.step()``
(a no-op outside ``trainmedic run``); a JSON checkpoint is saved every 5
steps and a start resumes from it by itself. At step ``--hang-at`` of the
first attempt it writes the wall time to ``<state>/hang_start`` and sleeps
forever. A resumed attempt writes the wall time its first step ended to
``<state>/first_resumed_step`` and stops after ``--after`` more steps.
``--import-torch`` makes each start pay for importing torch, as a real job does.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import trainmedic


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", required=True)
    parser.add_argument("--step-s", type=float, default=0.1)
    parser.add_argument("--hang-at", type=int, default=20)
    parser.add_argument("--after", type=int, default=3)
    parser.add_argument("--import-torch", action="store_true", help="start like a torch job")
    args = parser.parse_args()
    if args.import_torch:
        import torch  # noqa: F401  (what a real job pays at every start)
    os.makedirs(args.state, exist_ok=True)
    ckpt = os.path.join(args.state, "ckpt.json")
    start = 0
    if os.path.exists(ckpt):
        with open(ckpt) as f:
            start = int(json.load(f)["step"])
    with open(os.path.join(args.state, "starts"), "a") as f:
        f.write(f"{start}\n")
    step = start
    while True:
        time.sleep(args.step_s)
        step += 1
        trainmedic.step()
        if start and step == start + 1:
            with open(os.path.join(args.state, "first_resumed_step"), "w") as f:
                f.write(f"{time.time()}\n")
        if start and step >= start + args.after:
            return
        if step % 5 == 0:
            tmp = ckpt + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"step": step}, f)
            os.replace(tmp, ckpt)
        if step == args.hang_at and not start:
            with open(os.path.join(args.state, "hang_start"), "w") as f:
                f.write(f"{time.time()}\n")
            time.sleep(10**6)


if __name__ == "__main__":
    main()
