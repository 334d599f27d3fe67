"""A loop that logs far too much: every step formats and writes a long line per parameter.

An ordinary script, not written for any tool and with no DataLoader: a small
MLP trains on tensors in memory, and after each step the loop logs, through
``logging``, the norm and mean of every weight row (as debugging code left in a
training script does), to a log file.

    python logging_loop.py LOG_FILE --steps 100
"""

import argparse
import logging

import torch
from torch import nn

log = logging.getLogger("train")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("log_file")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--rows", type=int, default=256)
    args = parser.parse_args()
    logging.basicConfig(
        filename=args.log_file, level=logging.DEBUG, format="%(asctime)s %(message)s"
    )
    torch.manual_seed(0)
    x = torch.randn(4096, 64)
    y = (x[:, 0] > 0).long()
    model = nn.Sequential(nn.Linear(64, args.rows), nn.ReLU(), nn.Linear(args.rows, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(1, args.steps + 1):
        i = (step * 64) % (4096 - 64)
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x[i : i + 64]), y[i : i + 64])
        loss.backward()
        optimizer.step()
        rows = model[0].weight.detach().numpy()
        for r, row in enumerate(rows):
            log.debug(
                "step %d row %d norm %.6f mean %.6f first %s",
                step,
                r,
                float((row**2).sum()) ** 0.5,
                float(row.mean()),
                list(row[:8]),
            )
        if step % 25 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
