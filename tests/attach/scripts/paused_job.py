"""A training job that stops in the middle until it gets SIGUSR1, then trains on and ends.

An ordinary script that knows nothing of trainmedic. Arguments: mode (``lock`` |
``gloo``), steps.

* ``lock``: at step 10 the main thread takes a lock the job already holds, and stays
  there: stuck on a lock. SIGUSR1's handler releases it.
* ``gloo`` (two ranks, under torchrun): the ranks all-reduce their gradients every step;
  at step 10 rank 1 sleeps until SIGUSR1, and rank 0 waits for it in its all-reduce:
  hung in a collective. The ranks train the same steps, in lockstep.

Prints ``ready`` once it trains (rank 0), ``stuck PID`` when the process that stops does,
and ``done STEPS`` at the end (every rank). Without SIGUSR1 it never ends.
"""

import contextlib
import os
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist


class Woken(Exception):
    pass


def main():
    mode, steps = sys.argv[1], int(sys.argv[2])
    rank = 0
    if mode == "gloo":
        dist.init_process_group("gloo")
        rank = dist.get_rank()
    torch.set_num_threads(1)
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    lock = threading.Lock()

    def wake(signum, frame):
        if mode == "lock" and lock.locked():
            lock.release()  # the main thread's acquire, retried after this handler, succeeds
        elif mode == "gloo":
            raise Woken

    signal.signal(signal.SIGUSR1, wake)
    for step in range(1, steps + 1):
        opt.zero_grad()
        x, y = torch.randn(32, 64), torch.randint(0, 4, (32,))
        torch.nn.functional.cross_entropy(model(x), y).backward()
        if mode == "gloo":
            for p in model.parameters():
                dist.all_reduce(p.grad)
        opt.step()
        if step == 5 and rank == 0:
            print("ready\n", end="", flush=True)  # one write: ranks share the pipe
        if step == 10 and mode == "lock":
            lock.acquire()
            print(f"stuck {os.getpid()}\n", end="", flush=True)
            lock.acquire()  # until SIGUSR1
            lock.release()
        if step == 10 and mode == "gloo" and rank == 1:
            print(f"stuck {os.getpid()}\n", end="", flush=True)
            with contextlib.suppress(Woken):
                time.sleep(3600)  # rank 1 is elsewhere until SIGUSR1
    if mode == "gloo":
        dist.destroy_process_group()
    print(f"done {steps}\n", end="", flush=True)
    if mode == "gloo":
        # torch's gloo backend sometimes aborts in the interpreter's teardown after
        # destroy_process_group ("terminate called without an active exception", about 1
        # run in 8 here, with no tool attached): the job's work is done, so it ends
        # without that teardown, and its exit status says what its training did.
        sys.stdout.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
