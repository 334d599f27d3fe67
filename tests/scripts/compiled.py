"""Training with torch.compile (the eager backend: no C compiler needed), the ways a
script uses it: a compiled model, a compiled function calling the model, and a whole
compiled training step, ``optimizer.step()`` included.

Not written for trainmedic. Argument: steps per way. Prints the graph breaks dynamo
counted in the compiled function, the reasons of those it counted while compiling the
training step (dynamo breaks it at ``backward()`` and inside torch's optimizer step),
then ``done``.
"""

import sys

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x):
        return self.body(x)


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    torch.manual_seed(0)
    model, loss_fn = Net(), nn.CrossEntropyLoss()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 8), torch.randint(0, 4, (16,))
    for _ in range(steps):  # eager first: the probe learns the model's classes
        opt.zero_grad()
        loss_fn(model(x), y).backward()
        opt.step()
    compiled = torch.compile(model, backend="eager")
    for _ in range(steps):
        opt.zero_grad()
        loss_fn(compiled(x), y).backward()
        opt.step()

    def forward_loss(x, y):
        return loss_fn(model(x), y)

    explained = torch._dynamo.explain(forward_loss)(x, y)
    step = torch.compile(forward_loss, backend="eager")
    for _ in range(steps):
        opt.zero_grad()
        step(x, y).backward()
        opt.step()

    def train_step(x, y):
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    counters = torch._dynamo.utils.counters
    counters["graph_break"].clear()
    whole = torch.compile(train_step, backend="eager")
    for _ in range(steps):
        whole(x, y)
    print("graph breaks", explained.graph_break_count)
    for reason in sorted(counters["graph_break"]):  # counted again at each recompilation
        print("training step graph break:", reason.splitlines()[0])
    print("done")


if __name__ == "__main__":
    main()
