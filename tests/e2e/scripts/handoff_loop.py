"""Training whose batches are made by other threads or processes, without a DataLoader.

An ordinary script, not written for any tool: the training loop only asks
for the next batch and waits; the work happens elsewhere (``--via``):

* ``pool`` — a ``concurrent.futures.ThreadPoolExecutor`` fetches each batch's
  samples, the loop waits on the futures;
* ``thread`` — a prefetch thread fills a ``queue.Queue`` of batches;
* ``processes`` — producer processes (``multiprocessing``) fill a
  ``multiprocessing.Queue``;
* ``asyncio`` — an event loop in a thread of its own fetches a batch's samples
  concurrently, the loop waits on ``run_coroutine_threadsafe(...).result()``;
* ``direct`` — no one else: the loop makes each sample itself, one after another.

What a sample costs (``--work``): ``store`` — a request to the sample store
(``sample_store.py``, another process on 127.0.0.1 that answers after tens of
milliseconds; ``--store shm:PATH``: on a Unix socket, the sample handed over in
shared memory); ``compute`` — features computed in pure Python; ``files`` — an
uncached read of a file (``O_DIRECT``, else ``posix_fadvise(DONTNEED)``).

    python handoff_loop.py --via pool --work store --store 127.0.0.1:PORT --steps 40
"""

import argparse
import asyncio
import concurrent.futures
import contextlib
import mmap
import multiprocessing
import os
import queue
import socket
import struct
import threading
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

import numpy as np
import torch
from torch import nn

FEATURES = 256
FILE_BYTES = 256 * 1024

# --- what one sample costs -------------------------------------------------------------------


class StoreClient:
    """One connection to the sample store (one per thread or process): ``HOST:PORT``, or
    ``shm:PATH`` for a store on a Unix socket answering through shared memory."""

    def __init__(self, address):
        self.block = None
        if address.startswith("shm:"):
            self.sock = socket.socket(socket.AF_UNIX)
            self.sock.settimeout(30)
            self.sock.connect(address[4:])
            self.file = self.sock.makefile("rb")
            name = self.file.readline().decode().strip()
            self.block = shared_memory.SharedMemory(name=name)
            # The store made the block and removes it: this process only attaches.
            with contextlib.suppress(Exception):
                resource_tracker.unregister(self.block._name, "shared_memory")
        else:
            host, port = address.rsplit(":", 1)
            self.sock = socket.create_connection((host, int(port)), timeout=30)
            self.file = self.sock.makefile("rb")

    def get(self, index):
        self.sock.sendall(f"{index}\n".encode())
        (n,) = struct.unpack(">I", self.file.read(4))
        if self.block is not None:
            return bytes(self.block.buf[:n])
        return self.file.read(n)


_local = threading.local()


def fetch_from_store(address, index):
    client = getattr(_local, "client", None)
    if client is None:
        client = _local.client = StoreClient(address)
    raw = client.get(index)
    return np.frombuffer(raw, dtype=np.float32)[:FEATURES].copy()


def compute_features(index, rounds=60):
    # Pure-Python feature engineering: the interpreter lock is held throughout.
    values = [((index * 7919 + k) % 1000) / 1000.0 for k in range(FEATURES)]
    for _ in range(rounds):
        values = [v * 0.97 + 0.01 * (k % 7) for k, v in enumerate(values)]
    return np.asarray(values, dtype=np.float32)


def read_file_uncached(path):
    flags = os.O_RDONLY | getattr(os, "O_DIRECT", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        fd, flags = os.open(path, os.O_RDONLY), os.O_RDONLY
    try:
        if not flags & getattr(os, "O_DIRECT", 0):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        buf = mmap.mmap(-1, FILE_BYTES)
        try:
            n = os.readv(fd, [buf])
        except OSError:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            n = os.readv(fd, [buf])
        x = np.frombuffer(bytes(buf[:n]), dtype=np.float32)[:FEATURES].copy()
        return np.nan_to_num(x, posinf=0.0, neginf=0.0).clip(-10, 10)
    finally:
        os.close(fd)


def write_files(root, n):
    root.mkdir(parents=True, exist_ok=True)
    if any(root.glob("*.bin")):
        return sorted(root.glob("*.bin"))
    rng = np.random.default_rng(0)
    for i in range(n):
        (root / f"{i:05d}.bin").write_bytes(
            rng.standard_normal(FILE_BYTES // 4).astype(np.float32).tobytes()
        )
    os.sync()
    return sorted(root.glob("*.bin"))


class Sampler:
    """Makes sample ``i`` the way ``--work`` says (picklable, for producer processes)."""

    def __init__(self, work, store, files):
        self.work, self.store, self.files = work, store, files

    def __call__(self, index):
        if self.work == "store":
            return fetch_from_store(self.store, index)
        if self.work == "files":
            return read_file_uncached(self.files[index % len(self.files)])
        return compute_features(index)


# --- who makes the batches -------------------------------------------------------------------


def batches_from_pool(sample, batch_size, steps, threads):
    with concurrent.futures.ThreadPoolExecutor(max_workers=threads) as pool:
        for step in range(steps):
            futures = [pool.submit(sample, step * batch_size + j) for j in range(batch_size)]
            yield np.stack([f.result() for f in futures])


def batches_from_thread(sample, batch_size, steps):
    ready = queue.Queue(maxsize=2)

    def produce():
        for step in range(steps):
            ready.put(np.stack([sample(step * batch_size + j) for j in range(batch_size)]))

    threading.Thread(target=produce, name="prefetch", daemon=True).start()
    for _ in range(steps):
        yield ready.get()


def _producer(sample, batch_size, steps, rank, count, out):
    for step in range(rank, steps, count):
        out.put((step, np.stack([sample(step * batch_size + j) for j in range(batch_size)])))


def batches_from_processes(sample, batch_size, steps, count):
    out = multiprocessing.Queue(maxsize=2 * count)
    procs = [
        multiprocessing.Process(
            target=_producer, args=(sample, batch_size, steps, r, count, out), daemon=True
        )
        for r in range(count)
    ]
    for p in procs:
        p.start()
    for _ in range(steps):
        yield out.get()[1]
    for p in procs:
        p.join(timeout=10)


def batches_from_asyncio(work, store, batch_size, steps, connections):
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="io-loop", daemon=True).start()
    host, port = store.rsplit(":", 1) if store else ("", "0")
    pool = asyncio.Queue() if work == "store" else None

    async def connect():
        for _ in range(connections):
            pool.put_nowait(await asyncio.open_connection(host, int(port)))

    async def get(index):
        if work != "store":
            await asyncio.sleep(0)
            return compute_features(index)
        reader, writer = await pool.get()
        try:
            writer.write(f"{index}\n".encode())
            await writer.drain()
            (n,) = struct.unpack(">I", await reader.readexactly(4))
            raw = await reader.readexactly(n)
        finally:
            pool.put_nowait((reader, writer))
        return np.frombuffer(raw, dtype=np.float32)[:FEATURES].copy()

    async def batch(step):
        got = await asyncio.gather(*(get(step * batch_size + j) for j in range(batch_size)))
        return np.stack(got)

    if pool is not None:
        asyncio.run_coroutine_threadsafe(connect(), loop).result()
    try:
        for step in range(steps):
            yield asyncio.run_coroutine_threadsafe(batch(step), loop).result()
    finally:
        loop.call_soon_threadsafe(loop.stop)


def batches_direct(sample, batch_size, steps):
    for step in range(steps):
        yield np.stack([sample(step * batch_size + j) for j in range(batch_size)])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--via", choices=("pool", "thread", "processes", "asyncio", "direct"),
                        default="pool")  # fmt: skip
    parser.add_argument("--work", choices=("store", "compute", "files"), default="store")
    parser.add_argument("--store", default="", help="HOST:PORT of sample_store.py")
    parser.add_argument("--data-dir", type=Path, default=Path("handoff-data"))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=4, help="pool threads")
    parser.add_argument("--producers", type=int, default=2, help="producer processes")
    parser.add_argument("--connections", type=int, default=4, help="asyncio connections")
    parser.add_argument("--hidden", type=int, default=128, help="the model's width")
    parser.add_argument("--layers", type=int, default=1, help="hidden layers")
    args = parser.parse_args()
    files = write_files(args.data_dir, 256) if args.work == "files" else []
    sample = Sampler(args.work, args.store, [str(f) for f in files])
    if args.via == "pool":
        batches = batches_from_pool(sample, args.batch_size, args.steps, args.threads)
    elif args.via == "thread":
        batches = batches_from_thread(sample, args.batch_size, args.steps)
    elif args.via == "processes":
        batches = batches_from_processes(sample, args.batch_size, args.steps, args.producers)
    elif args.via == "asyncio":
        batches = batches_from_asyncio(
            args.work, args.store, args.batch_size, args.steps, args.connections
        )
    else:
        batches = batches_direct(sample, args.batch_size, args.steps)
    torch.manual_seed(0)
    layers = [nn.Linear(FEATURES, args.hidden), nn.ReLU()]
    for _ in range(args.layers - 1):
        layers += [nn.Linear(args.hidden, args.hidden), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(args.hidden, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, x in enumerate(batches, 1):
        x = torch.from_numpy(x)
        y = torch.arange(len(x)) % 10
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 10 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
