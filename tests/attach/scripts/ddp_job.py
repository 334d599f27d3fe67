"""Two ranks on gloo that train in lockstep (run by torchrun; not written for trainmedic).

Arguments: mode (``train`` | ``rank1-stops``), seconds. ``rank1-stops``: after 10 steps
rank 1 sleeps for good and rank 0 waits in its all-reduce. Prints ``ready`` (rank 0), and
``stopped`` (rank 1) before its sleep.
"""

import sys
import time

import torch
import torch.distributed as dist


def main():
    mode, seconds = sys.argv[1], float(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.set_num_threads(1)
    model = torch.nn.Linear(64, 64)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    steps, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        opt.zero_grad()
        model(torch.randn(32, 64)).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
        steps += 1
        if steps == 5 and rank == 0:
            print("ready", flush=True)
        if mode == "rank1-stops" and rank == 1 and steps == 10:
            print("stopped", flush=True)
            time.sleep(3600)  # rank 1 is elsewhere for good
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
