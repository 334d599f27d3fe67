"""The job the restart benchmark runs: steady steps, its own checkpoints, one fault.

Each step sleeps ``--step-s`` seconds and marks itself with ``trainmedic.step()``
(a no-op outside ``trainmedic run``); a JSON checkpoint is saved every 5
steps and a start resumes from it by itself. At step ``--hang-at`` of the
first attempt it writes the wall time to ``<state>/hang_start`` and hangs
(``--hang``: ``sleep`` forever, a ``lock`` nobody releases, a ``busy`` Python
loop). A resumed attempt writes the wall time its first step ended to
``<state>/first_resumed_step`` and stops after ``--after`` more steps.

``--crash-after-s S --crashes N`` instead makes each of the first N attempts
crash (SIGSEGV) after S seconds of training, and the job stops at
``--total-steps``; ``<state>/done`` then holds the wall time of the end.
``--import-torch`` makes each start pay for importing torch, as a real job
does; ``--nvrx`` sends NVIDIA Resiliency Extension heartbeats each step (the
code change ``ft_launcher`` needs to detect a hang).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time

import trainmedic


def hang(kind: str) -> None:
    if kind == "sleep":
        while True:
            time.sleep(1)
    elif kind == "lock":
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()
    else:
        x = 0
        while x >= 0:
            x += 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", required=True)
    parser.add_argument("--step-s", type=float, default=0.1)
    parser.add_argument("--hang-at", type=int, default=20)
    parser.add_argument("--hang", default="sleep", choices=["sleep", "lock", "busy"])
    parser.add_argument("--after", type=int, default=3)
    parser.add_argument("--crash-after-s", type=float, default=None)
    parser.add_argument("--crashes", type=int, default=0)
    parser.add_argument("--total-steps", type=int, default=None)
    parser.add_argument("--import-torch", action="store_true", help="start like a torch job")
    parser.add_argument("--nvrx", action="store_true", help="send NVRx heartbeats")
    args = parser.parse_args()
    if args.import_torch:
        import torch  # noqa: F401  (what a real job pays at every start)
    client = None
    if args.nvrx:
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

        client = RankMonitorClient()
        client.init_workload_monitoring()
    os.makedirs(args.state, exist_ok=True)
    ckpt = os.path.join(args.state, "ckpt.json")
    start = 0
    if os.path.exists(ckpt):
        with open(ckpt) as f:
            start = int(json.load(f)["step"])
    with open(os.path.join(args.state, "starts"), "a") as f:
        f.write(f"{start} {time.time()}\n")
    with open(os.path.join(args.state, "starts")) as f:
        crashes = len(f.read().splitlines()) - 1  # the starts before this one
    crash_loop = args.crash_after_s is not None
    began = time.monotonic()
    step = start
    while True:
        time.sleep(args.step_s)
        step += 1
        trainmedic.step()
        if client is not None:
            client.send_heartbeat()
        if start and step == start + 1 and not crash_loop:
            with open(os.path.join(args.state, "first_resumed_step"), "w") as f:
                f.write(f"{time.time()}\n")
        if step % 5 == 0:
            tmp = ckpt + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"step": step}, f)
            os.replace(tmp, ckpt)
        if crash_loop:
            if args.total_steps is not None and step >= args.total_steps:
                break
            if crashes < args.crashes and time.monotonic() - began >= args.crash_after_s:
                os.kill(os.getpid(), signal.SIGSEGV)
            continue
        if start and step >= start + args.after:
            break
        if step == args.hang_at and not start:
            with open(os.path.join(args.state, "hang_start"), "w") as f:
                f.write(f"{time.time()}\n")
            hang(args.hang)
    with open(os.path.join(args.state, "done"), "w") as f:
        f.write(f"{time.time()}\n")
    if client is not None:
        client.shutdown_workload_monitoring()


if __name__ == "__main__":
    main()
