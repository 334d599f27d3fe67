"""A real host out-of-memory error inside a wrapped step, under an address-space limit.

Prints one JSON line: the attempts the step made and the largest difference
between its gradients and the full batch's (computed after the limit is lifted).
"""

import json
import resource

import torch
from torch import nn

from trainmedic.remedies.microbatch import MicroBatchStep

BATCH = 2048
HEADROOM = 96 * 2**20  # the whole batch needs ~300 MiB more, a sixteenth of it fits


def vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize")


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 8192), nn.ReLU(), nn.Linear(8192, 10))
    x, y = torch.randn(BATCH, 256), torch.randint(0, 10, (BATCH,))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)

    def loss_fn(batch):
        xb, yb = batch
        return nn.functional.cross_entropy(model(xb), yb)

    step = MicroBatchStep(loss_fn, opt, environ={})
    loss_fn((x[:8], y[:8])).backward()  # allocate what every step needs, then clear
    opt.zero_grad(set_to_none=False)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm_size() + HEADROOM, hard))
    try:
        step((x, y))
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))
    got = [p.grad.clone() for p in model.parameters()]
    opt.zero_grad()
    loss_fn((x, y)).backward()
    want = [p.grad for p in model.parameters()]
    diff = max(float((a - b).abs().max()) for a, b in zip(got, want, strict=True))
    scale = max(float(b.abs().max()) for b in want)
    print(
        json.dumps(
            {
                "attempts": [[o.micro_batch_size, o.ok] for o in step.history],
                "max_abs_diff": diff,
                "max_abs_grad": scale,
            }
        )
    )


if __name__ == "__main__":
    main()
