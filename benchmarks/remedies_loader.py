"""DataLoader tuning on input-bound data: throughput before and after, against the
data-resident bound.

Three input-bound datasets, each feeding the same small training step
(``torch.set_num_threads(1)``, a two-layer MLP over 3x32x32 images):

* ``cpu``: a CPU-heavy per-sample transform (~1 ms per sample);
* ``files``: one file per sample on an emulated network filesystem (every read
  waits ``--read-delay-ms``, as a remote disk's latency);
* ``http``: one HTTP request per sample to a server on 127.0.0.1 in another
  process, answering after ``--http-delay-ms``.

For each: samples/s of training with the DataLoader's defaults (**before**),
with the settings ``tune_dataloader`` finds within ``--budget`` seconds
(**after**), and with every batch already in memory (**bound**: the training
step alone; no loader can beat it). Then, for the ``cpu`` and ``http``
datasets, the tuner's budget against the speed-up its settings give in training.

    python benchmarks/remedies_loader.py [--budget 20] [--steps 60]
        [--budgets 4 8 16 32] [--only cpu files http] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import multiprocessing
import os
import socket
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from trainmedic.remedies import ThreadedFetch, tune_dataloader
from trainmedic.remedies.loader_measure import LoaderSettings
from trainmedic.remedies.stats import bootstrap_ratio_ci

BATCH = 32
SHAPE = (3, 32, 32)


class CpuTransform(Dataset):
    def __init__(self, n: int = 50_000, rounds: int = 15) -> None:
        self.n, self.rounds = n, rounds

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(i)
        x = torch.rand(SHAPE, generator=g)
        for _ in range(self.rounds):
            x = torch.tanh(x * 1.01 + 0.01)
        return x, i % 10


class SlowFiles(Dataset):
    """One .npy-like raw file per sample; each read waits as on a network filesystem."""

    def __init__(self, root: Path, n: int, delay_s: float) -> None:
        self.files = [str(root / f"{i:06d}.bin") for i in range(n)]
        self.delay_s = delay_s
        for i, f in enumerate(self.files):
            if not os.path.exists(f):
                Path(f).write_bytes(torch.full(SHAPE, i / n).numpy().tobytes())

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        time.sleep(self.delay_s)  # the remote disk's latency
        with open(self.files[i], "rb") as f:
            data = bytearray(f.read())
        return torch.frombuffer(data, dtype=torch.float32).view(SHAPE), i % 10


class SlowHttp(Dataset):
    def __init__(self, port: int, n: int) -> None:
        self.url = f"http://127.0.0.1:{port}/"
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with urllib.request.urlopen(f"{self.url}{i}", timeout=30) as r:
            data = bytearray(r.read())
        return torch.frombuffer(data, dtype=torch.float32).view(SHAPE), i % 10


def _serve(port: int, delay_s: float) -> None:
    payload = torch.zeros(SHAPE).numpy().tobytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            time.sleep(delay_s)
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.serve_forever()


@contextlib.contextmanager
def http_server(delay_s: float) -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = multiprocessing.get_context("spawn").Process(target=_serve, args=(port, delay_s))
    proc.start()
    for _ in range(100):
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.1):
            break
        time.sleep(0.05)
    try:
        yield port
    finally:
        proc.terminate()
        proc.join(5)


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 1024), nn.ReLU(), nn.Linear(1024, 10))


def train(batches: Any, steps: int, warmup: int = 5) -> list[float]:
    """Samples/s of each training step after the warm-up."""
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    rates: list[float] = []
    it = iter(batches)
    t = time.perf_counter()
    for i in range(warmup + steps):
        x, y = next(it)
        loss = nn.functional.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        now = time.perf_counter()
        if i >= warmup:
            rates.append(len(x) / (now - t))
        t = now
    return rates


def loader(dataset: Dataset, s: LoaderSettings) -> DataLoader:
    s = s.normalized()
    ds = ThreadedFetch(dataset, s.threads) if s.threads > 1 else dataset
    kw: dict[str, Any] = {"num_workers": s.num_workers, "pin_memory": s.pin_memory}
    if s.num_workers:
        kw.update(prefetch_factor=s.prefetch, persistent_workers=True)
    return DataLoader(ds, batch_size=BATCH, shuffle=True, **kw)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def measure(dataset: Dataset, budget: float, steps: int) -> dict[str, Any]:
    resident = [
        b for _, b in zip(range(steps + 5), DataLoader(dataset, batch_size=BATCH), strict=False)
    ]
    bound = train(resident, steps)
    before = train(loader(dataset, LoaderSettings()), steps)
    # The tuner is told the training step's time (as a user would from a run's
    # compute per step), so it compares settings beside training, not alone.
    step_s = BATCH / mean(bound)
    t0 = time.perf_counter()
    result = tune_dataloader(dataset, batch_size=BATCH, budget_s=budget, step_s=step_s)
    tuning_s = time.perf_counter() - t0
    after = train(loader(dataset, result.recommended), steps)
    ci = bootstrap_ratio_ci(after, before)
    return {
        "bound": mean(bound),
        "before": mean(before),
        "after": mean(after),
        "speedup": mean(after) / mean(before),
        "speedup_ci": ci,
        "of_bound_before": mean(before) / mean(bound),
        "of_bound_after": mean(after) / mean(bound),
        "settings": result.recommended.label(),
        "tuner_speedup": result.speedup,
        "tuning_s": tuning_s,
        "kind": result.profile.kind,
        "step_s": step_s,
    }


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--budget", type=float, default=20.0)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--budgets", type=float, nargs="*", default=[4.0, 8.0, 16.0, 32.0])
    p.add_argument("--only", nargs="*", default=["cpu", "files", "http"])
    p.add_argument("--read-delay-ms", type=float, default=5.0)
    p.add_argument("--http-delay-ms", type=float, default=10.0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    out: dict[str, Any] = {"cores": len(os.sched_getaffinity(0)), "budget_s": args.budget}
    with tempfile.TemporaryDirectory() as tmp, http_server(args.http_delay_ms / 1000) as port:
        datasets = {
            "cpu": CpuTransform(),
            "files": SlowFiles(Path(tmp), 4096, args.read_delay_ms / 1000),
            "http": SlowHttp(port, 50_000),
        }
        print("| data | kind | before | after (tuned) | bound | after / before (95 % CI) "
              "| before / bound | after / bound | settings found | tuning s |")  # fmt: skip
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name in args.only:
            r = measure(datasets[name], args.budget, args.steps)
            out[name] = r
            lo, hi = r["speedup_ci"] or (float("nan"), float("nan"))
            print(
                f"| {name} | {r['kind']} | {r['before']:.0f} | {r['after']:.0f} | {r['bound']:.0f} "
                f"| {r['speedup']:.2f}x ({lo:.2f}-{hi:.2f}) | {r['of_bound_before']:.0%} "
                f"| {r['of_bound_after']:.0%} | {r['settings']} | {r['tuning_s']:.1f} |",
                flush=True,
            )
        if args.budgets:
            print("\n| data | budget s | tuning took s | settings found | speed-up in training |")
            print("|---|---|---|---|---|")
            out["budgets"] = {}
            for name in [n for n in ("cpu", "http") if n in args.only]:
                ds = datasets[name]
                before = mean(train(loader(ds, LoaderSettings()), args.steps))
                step_s = out[name]["step_s"] if name in out else 0.0
                for budget in args.budgets:
                    t0 = time.perf_counter()
                    res = tune_dataloader(ds, batch_size=BATCH, budget_s=budget, step_s=step_s)
                    took = time.perf_counter() - t0
                    after = mean(train(loader(ds, res.recommended), args.steps))
                    out["budgets"][f"{name}/{budget:g}"] = {
                        "took_s": took,
                        "settings": res.recommended.label(),
                        "speedup": after / before,
                    }
                    print(f"| {name} | {budget:g} | {took:.1f} | {res.recommended.label()} "
                          f"| {after / before:.2f}x |", flush=True)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2, default=str))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
