"""A CPU training loop of short steps that counts its probe threads' wake-ups.

Usage: steady_loop.py SECONDS WARMUP_S. Trains for SECONDS with a DataLoader of
in-memory tensors; from WARMUP_S on it counts the voluntary context switches
(wake-ups) of each ``trainmedic-*`` thread and prints one JSON line:
{"steps": N, "rates": {thread name: wake-ups per second}}.
"""

import json
import sys
import threading
import time

import torch


def wakeups():
    out = {}
    for t in threading.enumerate():
        if t.name.startswith("trainmedic"):
            with open(f"/proc/self/task/{t.native_id}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        out[t.name] = int(line.split()[1])
    return out


def main():
    seconds, warmup = float(sys.argv[1]), float(sys.argv[2])
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.utils.data.TensorDataset(torch.randn(1 << 16, 32), torch.randint(0, 4, (1 << 16,)))
    loader = torch.utils.data.DataLoader(data, batch_size=16)
    start = time.monotonic()
    steps = 0
    first = None
    while True:
        for x, y in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            steps += 1
            now = time.monotonic() - start
            if first is None and now >= warmup:
                first = (now, wakeups())
            if now >= seconds:
                last = (now, wakeups())
                span = last[0] - first[0]
                rates = {k: (v - first[1].get(k, 0)) / span for k, v in last[1].items()}
                print(json.dumps({"steps": steps, "rates": rates}), flush=True)
                return


if __name__ == "__main__":
    main()
