"""A small trainer that saves and resumes its own checkpoint and fails once on purpose.

It knows nothing about trainmedic except ``trainmedic.step()`` (it has no
torch optimizer for the probe to hook): each step sleeps ``--step-s``, a
checkpoint (``<state>/ckpt-<step>.json``, written atomically) is saved every
``--every`` steps, and a start resumes from the newest by itself (or only
from ``--resume PATH`` with ``--no-auto-resume``). At step ``--at``
of the first attempt (no ``<state>/faulted`` marker yet; every attempt with
``--always``) it injects ``--fault``:

sleep, lock (a lock acquired twice), deadlock (two threads, two locks, the
main thread joining them), busy (a Python loop spinning in place), cblock (a
native deadlock in a C call that holds the GIL), segfault, sigkill, exception (a bug), exit3
(``sys.exit(3)``), none.

Every pid it starts is appended to ``<state>/pids`` (``--children N`` starts
N sleeping grandchildren in a session of their own: orphans-to-be). It writes
``<state>/resumed`` with the step it resumed from and ``<state>/done`` with
the last step when it finishes.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time

import trainmedic


def save(state: str, step: int) -> None:
    tmp = os.path.join(state, ".ckpt.tmp")
    with open(tmp, "w") as f:
        json.dump({"step": step}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(state, f"ckpt-{step}.json"))


def load(path: str) -> int:
    with open(path) as f:
        return int(json.load(f)["step"])


def newest(state: str) -> str | None:
    files = [n for n in os.listdir(state) if n.startswith("ckpt-") and n.endswith(".json")]
    if not files:
        return None
    best = max(files, key=lambda n: int(n[len("ckpt-") : -len(".json")]))
    return os.path.join(state, best)


def note_pid(state: str, pid: int) -> None:
    with open(os.path.join(state, "pids"), "a") as f:
        f.write(f"{pid}\n")


def deadlock() -> None:
    a, b = threading.Lock(), threading.Lock()
    ready = threading.Barrier(2)

    def one() -> None:
        with a:
            ready.wait()
            with b:
                pass

    def two() -> None:
        with b:
            ready.wait()
            with a:
                pass

    threads = [threading.Thread(target=one), threading.Thread(target=two)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def spin() -> None:
    x = 0
    while True:
        x += 1
        if x < 0:
            break


def bad_batch(step: int) -> None:
    raise ValueError(f"batch {step} has the wrong shape")


def fault(kind: str, step: int) -> None:
    print(f"injecting {kind} at step {step}", flush=True)
    if kind == "sleep":
        time.sleep(3600)
    elif kind == "lock":
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()
    elif kind == "deadlock":
        deadlock()
    elif kind == "busy":
        spin()
    elif kind == "cblock":
        # A native deadlock: a pthread mutex locked twice by one thread. PyDLL keeps
        # the GIL during the call, and a mutex wait ignores signals: no Python code
        # runs in this process any more, not even the probe's thread.
        libc = ctypes.PyDLL(None)
        mutex = ctypes.create_string_buffer(64)  # zeros: PTHREAD_MUTEX_INITIALIZER
        libc.pthread_mutex_lock(mutex)
        libc.pthread_mutex_lock(mutex)
    elif kind == "segfault":
        ctypes.string_at(0)
    elif kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "exception":
        bad_batch(step)
    elif kind == "exit3":
        sys.exit(3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", required=True)
    parser.add_argument("--fault", default="none")
    parser.add_argument("--at", type=int, default=30)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--step-s", type=float, default=0.01)
    parser.add_argument("--children", type=int, default=0)
    parser.add_argument("--always", action="store_true")
    parser.add_argument("--resume", default=None, help="resume from this checkpoint")
    parser.add_argument(
        "--on-sigterm",
        choices=("default", "save", "ignore"),
        default="default",
        help="save: checkpoint the current step and exit 143; ignore: keep going",
    )
    parser.add_argument(
        "--no-auto-resume", action="store_true", help="resume only when --resume is given"
    )
    args = parser.parse_args()
    os.makedirs(args.state, exist_ok=True)
    note_pid(args.state, os.getpid())
    for _ in range(args.children):
        child = subprocess.Popen(["sleep", "3600"], start_new_session=True)
        note_pid(args.state, child.pid)
    path = args.resume or (None if args.no_auto_resume else newest(args.state))
    start = load(path) if path else 0
    with open(os.path.join(args.state, "resumed"), "a") as f:
        f.write(f"{start}\n")
    marker = os.path.join(args.state, "faulted")
    current = [start]
    if args.on_sigterm == "save":

        def save_and_exit(_signum: int, _frame: object) -> None:
            save(args.state, current[0])
            with open(os.path.join(args.state, "preempted"), "w") as f:
                f.write(f"{current[0]}\n")
            sys.exit(143)

        signal.signal(signal.SIGTERM, save_and_exit)
    elif args.on_sigterm == "ignore":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    for step in range(start + 1, args.steps + 1):
        current[0] = step
        time.sleep(args.step_s)
        trainmedic.step()
        if step % args.every == 0:
            save(args.state, step)
        if step == args.at and (args.always or not os.path.exists(marker)):
            open(marker, "w").close()
            fault(args.fault, step)
    with open(os.path.join(args.state, "done"), "w") as f:
        f.write(f"{args.steps}\n")
    print("finished", flush=True)


if __name__ == "__main__":
    main()
