"""The training jobs the overhead benchmarks run: small CPU models, one torch thread.

* ``mlp``: 64-256-256-10 MLP, SGD (momentum 0.9), batch 64 - about 0.7 ms a step;
  5 module calls per forward plus the loss.
* ``deep``: 16 blocks of Linear(64,64)+LayerNorm+GELU and a Linear head, AdamW,
  batch 32 - about 3.5 ms a step; 66 module calls per forward plus the loss.
* ``transformer``: a 20-layer pre-norm transformer (width 32, 4 heads, sequence
  16, batch 8), AdamW - about 18 ms a step; 287 module calls per step.
* ``tiny``: 8-8-2 MLP, SGD, batch 4: a step of about 0.1 ms, so that the probe's
  own cost per step stands out of the machine's noise.
* ``deep-N``: the ``deep`` network with N blocks (4 N + 2 module calls per
  forward), to show how a cost grows with the number of module calls.
* ``seq-N``: ``deep-N`` built only from nested ``nn.Sequential`` (the root's
  class is also the class of every block).
* ``handoff``: the ``mlp`` fed without a DataLoader: a ``ThreadPoolExecutor`` of 4
  threads fetches each batch's 16 samples from a sample store in another process
  (``HOST:PORT`` in the environment variable ``BENCH_STORE``;
  ``tests/e2e/scripts/sample_store.py``), and the loop waits on the futures - the
  shape whose wait the probe follows to the threads and to the store.

Every other job reads its batches from a ``DataLoader`` over tensors in memory
(``num_workers=0``), as small-step training does.
"""

from __future__ import annotations

import concurrent.futures
import math
import os
import socket
import struct
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

MODELS = ("mlp", "deep", "transformer")


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.linear(x)))


class DeepNet(nn.Module):
    def __init__(self, blocks: int, width: int = 64, classes: int = 10) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(width) for _ in range(blocks))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, width)
        self.v = nn.Linear(width, width)
        self.out = nn.Linear(width, width)
        self.drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.heads

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, h, c // h).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        weights = (q @ k.transpose(-2, -1)) / math.sqrt(c // h)
        y = self.drop(weights.softmax(-1)) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, c))


class Mlp(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * width, width)
        self.drop = nn.Dropout(0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.act(self.fc1(x))))


class Layer(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = Attention(width, heads)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = Mlp(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Transformer(nn.Module):
    def __init__(
        self, layers: int = 20, width: int = 32, heads: int = 4, vocab: int = 64, seq: int = 16
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq, width)
        self.layers = nn.ModuleList(Layer(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1])
        x = self.embed(tokens) + self.pos(positions)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


class TokenLoss(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ce = nn.CrossEntropyLoss()

    def forward(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.ce(logits.flatten(0, 1), targets.flatten())


@dataclass
class Job:
    """A model, its optimizer, loss and loader; :meth:`step` runs one training step."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: nn.Module
    loader: Iterable[Any]

    def step(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        self.loss_fn(self.model(x), y).backward()
        self.optimizer.step()


class StoreBatches:
    """Batches of ``batch`` samples fetched by a pool of ``threads`` from the sample store
    at ``address`` (``HOST:PORT``), one connection per thread; ``batches`` an epoch."""

    def __init__(self, address: str, batches: int, batch: int = 16, threads: int = 4) -> None:
        host, port = address.rsplit(":", 1)
        self.address = (host, int(port))
        self.batches, self.batch = batches, batch
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads)
        self.local = threading.local()
        self.labels = torch.randint(0, 10, (batch,))

    def fetch(self, index: int) -> torch.Tensor:
        conn = getattr(self.local, "conn", None)
        if conn is None:
            sock = socket.create_connection(self.address, timeout=30)
            conn = self.local.conn = (sock, sock.makefile("rb"))
        sock, reader = conn
        sock.sendall(f"{index}\n".encode())
        (n,) = struct.unpack(">I", reader.read(4))
        return torch.frombuffer(bytearray(reader.read(n)), dtype=torch.float32)[:64]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for b in range(self.batches):
            futures = [self.pool.submit(self.fetch, b * self.batch + i) for i in range(self.batch)]
            yield torch.stack([f.result() for f in futures]), self.labels


def build(name: str, batches: int = 256) -> Job:
    """The job called ``name`` (see the module doc), its loader holding ``batches`` batches."""
    torch.manual_seed(0)
    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss_fn: nn.Module
    if name == "tiny":
        batch = 4
        n = batches * batch
        data = TensorDataset(torch.randn(n, 8), torch.randint(0, 2, (n,)))
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        loss_fn = nn.CrossEntropyLoss()
    elif name in ("mlp", "handoff"):
        batch = 64
        n = batches * batch
        data = TensorDataset(torch.randn(n, 64), torch.randint(0, 10, (n,)))
        model = nn.Sequential(
            nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()
    elif name == "deep" or name.startswith(("deep-", "seq-")):
        blocks = 16 if name == "deep" else int(name.split("-", 1)[1])
        batch = 32
        n = batches * batch
        data = TensorDataset(torch.randn(n, 64), torch.randint(0, 10, (n,)))
        if name.startswith("seq-"):
            model = nn.Sequential(
                *(
                    nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.GELU())
                    for _ in range(blocks)
                ),
                nn.Linear(64, 10),
            )
        else:
            model = DeepNet(blocks)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss_fn = nn.CrossEntropyLoss()
    elif name == "transformer":
        batch, seq, vocab = 8, 16, 64
        tokens = torch.randint(0, vocab, (batches * batch, seq + 1))
        data = TensorDataset(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())
        model = Transformer(seq=seq, vocab=vocab)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loss_fn = TokenLoss()
    else:
        raise ValueError(
            f"unknown model {name!r}: mlp, deep, transformer, tiny, handoff, deep-N or seq-N"
        )
    if name == "handoff":
        store = os.environ.get("BENCH_STORE")
        if not store:
            raise ValueError("the handoff job needs BENCH_STORE=HOST:PORT of a sample store")
        return Job(model, optimizer, loss_fn, StoreBatches(store, batches))
    loader = DataLoader(data, batch_size=batch, shuffle=True, drop_last=True)
    return Job(model, optimizer, loss_fn, loader)


def module_calls(job: Job) -> int:
    """Module calls in one training step (forward and loss), counted with a global hook."""
    from torch.nn.modules.module import register_module_forward_pre_hook

    count = 0

    def counter(module: nn.Module, args: Any) -> None:
        nonlocal count
        count += 1

    x, y = next(iter(job.loader))
    handle = register_module_forward_pre_hook(counter)
    try:
        job.step(x, y)
    finally:
        handle.remove()
    return count
