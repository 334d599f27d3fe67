"""A small DDP job on CPU (gloo) for the distributed tests; configured by environment.

DATA_SLOW_RANK / DATA_SLOW_S: that rank's Dataset spends this long preparing each
batch (a Python transform, busy on the CPU, so its loader's stacks show it).
HANG_RANK / HANG_AT: that rank blocks forever before this step, in attempt 1 only.
STEPS: steps in all (resumed runs continue from the checkpoint); CKPT_EVERY: save period.
RESULT: rank 0 writes {"start": step resumed from, "end": last step} there at the end.
"""

import json
import os
import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import trainmedic

dist.init_process_group("gloo")
RANK = dist.get_rank()
SLOW_RANK = int(os.environ.get("DATA_SLOW_RANK", "-1"))
SLOW_S = float(os.environ.get("DATA_SLOW_S", "0"))
HANG_RANK = int(os.environ.get("HANG_RANK", "-1"))
HANG_AT = int(os.environ.get("HANG_AT", "0"))
STEPS = int(os.environ.get("STEPS", "60"))
BATCH = 16
torch.manual_seed(0)


class Samples(Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        if RANK == SLOW_RANK and SLOW_S > 0:
            end = time.perf_counter() + SLOW_S / BATCH
            x = 0
            while time.perf_counter() < end:  # an expensive transform
                x += 1
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, generator=g), i % 4


model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
ckpt = None
start = 0
if os.environ.get("CKPT_EVERY"):
    ckpt = trainmedic.Checkpointer(every_steps=int(os.environ["CKPT_EVERY"]))
    start = ckpt.load(model=model.module, optimizer=opt) or 0
attempt = os.environ.get("TRAINMEDIC_ATTEMPT", "1")
loader = DataLoader(Samples(), batch_size=BATCH)
step = start
for x, y in loader:
    if step >= STEPS:
        break
    if RANK == HANG_RANK and step == HANG_AT and attempt == "1":
        time.sleep(10_000)  # a rank stuck: the others wait in the all-reduce
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    if ckpt is not None:
        ckpt.maybe_save(step, model=model.module, optimizer=opt)
if RANK == 0 and os.environ.get("RESULT"):
    with open(os.environ["RESULT"], "w") as f:
        json.dump({"start": start, "end": step, "attempt": attempt}, f)
dist.destroy_process_group()
