"""Two ranks (gloo, CPU) with DDP; rank 1 runs out of memory above LIMIT samples.

Usage: python ddp_microbatch.py OUT_DIR. Each rank writes OUT_DIR/rank<r>.json:
the attempts of its steps, its final micro-batch size and its gradients' largest
difference from a single-process reference over both ranks' full batches.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainmedic.remedies.microbatch import MicroBatchStep

BATCH = 16
LIMIT = {0: 64, 1: 5}  # rank 1 fits only 5 samples at once
OOM = "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 bytes"


def data(rank: int):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(BATCH, 6, generator=g), torch.randint(0, 3, (BATCH,), generator=g)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3))


def worker(rank: int, out: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    ddp = DistributedDataParallel(model())
    seen: list[int] = []

    def loss_fn(batch):
        x, y = batch
        seen.append(len(x))
        out = ddp(x)
        if len(x) > LIMIT[rank]:
            raise RuntimeError(OOM)  # after the forward: the case that needs the vote
        return nn.functional.cross_entropy(out, y)

    opt = torch.optim.SGD(ddp.parameters(), lr=0.0)
    step = MicroBatchStep(loss_fn, opt, model=ddp, environ={}, free=lambda: None)
    for _ in range(2):
        step(data(rank))
    grads = [p.grad.clone() for p in ddp.parameters()]
    reference = model()
    loss = sum(nn.functional.cross_entropy(reference(x), y) for x, y in (data(0), data(1))) / 2
    loss.backward()
    diff = max(
        float((a - p.grad).abs().max()) for a, p in zip(grads, reference.parameters(), strict=True)
    )
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(
            {
                "attempts": [[o.micro_batch_size, o.ok] for o in step.history],
                "micro_batch_size": step.micro_batch_size,
                "sizes_seen": seen,
                "max_abs_diff": diff,
            },
            f,
        )
    dist.barrier()  # neither rank leaves while the other may still talk to it
    dist.destroy_process_group()


if __name__ == "__main__":
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    mp.spawn(worker, args=(sys.argv[1], free_port), nprocs=2, join=True)
