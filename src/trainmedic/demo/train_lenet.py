"""Train a LeNet-style CNN on synthetic MNIST-shaped digits: an ordinary PyTorch script.

The model is the one of the article the project started from (conv 1->20
5x5, pool, conv 20->50 5x5, pool, fc 800->500, fc 500->10, SGD with momentum,
batch 64). The digits are drawn on the fly by the sibling module ``digits``,
so nothing is downloaded. Flags reproduce the set-ups that make real training
slow, one at a time:

  --augment            a CPU-heavy per-sample augmentation (elastic distortion)
  --workers N          DataLoader worker processes (0: the training process loads)
  --threads N          torch's intra-op threads; with workers on few cores, fewer
                       threads keep them from crowding each other out
  --dataset-dir DIR    read one .npy file per sample from DIR (written there first
                       when DIR holds none, like torchvision's download=True)
  --read-delay-ms MS   every file read waits MS milliseconds for its data, as on a
                       slow network disk
  --checkpoint-every N save model and optimizer every N steps, synchronously, to
                       --checkpoint-dir
  --disk-mib-per-s R   the disk writes R MiB/s, as a slow network disk

    python train_lenet.py --steps 300 --workers 0 --augment
"""

from __future__ import annotations

import argparse
import io
import math
import os
import queue
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from digits import make_digits, write_digits  # type: ignore[import-not-found]  # a sibling file
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Net(nn.Module):
    """LeNet as in the article: two 5x5 convolutions with pooling, two linear layers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 20, 5)
        self.conv2 = nn.Conv2d(20, 50, 5)
        self.fc1 = nn.Linear(4 * 4 * 50, 500)
        self.fc2 = nn.Linear(500, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(torch.relu(self.conv1(x)), 2, 2)
        x = F.max_pool2d(torch.relu(self.conv2(x)), 2, 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        logits: torch.Tensor = self.fc2(x)
        return logits


# --- augmentation ------------------------------------------------------------------------


def _smooth(field: npt.NDArray[np.float64], sigma: float) -> npt.NDArray[np.float64]:
    """Gaussian blur of a 2-D field by two 1-D convolutions (numpy only)."""
    radius = int(3 * sigma)
    k = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma) ** 2)
    k /= k.sum()
    out = np.apply_along_axis(np.convolve, 0, field, k, mode="same")
    return np.apply_along_axis(np.convolve, 1, out, k, mode="same")


def elastic(
    image: npt.NDArray[np.float32], rng: np.random.Generator, alpha: float = 34.0
) -> npt.NDArray[np.float32]:
    """Elastic distortion (Simard et al., 2003): a smoothed random displacement field
    moves every pixel; resampled bilinearly. ``image`` is (28, 28), values 0..1."""
    h, w = image.shape
    dx = _smooth(rng.uniform(-1, 1, (h, w)), 4.0) * alpha
    dy = _smooth(rng.uniform(-1, 1, (h, w)), 4.0) * alpha
    yy, xx = np.mgrid[0:h, 0:w]
    x = np.clip(xx + dx, 0, w - 1.001)
    y = np.clip(yy + dy, 0, h - 1.001)
    x0, y0 = x.astype(np.int64), y.astype(np.int64)
    fx, fy = x - x0, y - y0
    out: npt.NDArray[np.float64] = (
        image[y0, x0] * (1 - fx) * (1 - fy)
        + image[y0, x0 + 1] * fx * (1 - fy)
        + image[y0 + 1, x0] * (1 - fx) * fy
        + image[y0 + 1, x0 + 1] * fx * fy
    )
    return out.astype(np.float32)


# --- data sets ---------------------------------------------------------------------------


class InMemoryDigits(Dataset[tuple[torch.Tensor, int]]):
    """Digits generated into memory at start."""

    def __init__(self, count: int, seed: int, augment: bool) -> None:
        images, labels = make_digits(count, seed)
        self.images = images
        self.labels = labels
        self.augment = augment
        self.tensors = torch.from_numpy(images).float().div_(255.0)
        self.draws = 0

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if not self.augment:
            return self.tensors[i], int(self.labels[i])
        # Seeded by torch's per-worker seed: forked workers must not share numpy's state.
        self.draws += 1
        rng = np.random.default_rng([torch.initial_seed() % 2**63, i, self.draws])
        image = elastic(self.images[i, 0].astype(np.float32) / 255.0, rng)
        return torch.from_numpy(image)[None], int(self.labels[i])


class SlowDisk:
    """Files as on a slow network disk: every read waits ``read_delay_s`` for its data,
    writes go at ``write_bytes_per_s``.

    A thread plays the disk for each reading thread: it waits the delay, then
    passes the file's bytes through a pipe, so the reader sits in a blocking
    ``read(2)`` exactly as on NFS or a cloud volume. Like those, the disk serves
    concurrent reads concurrently (each one waits its own delay), so threads
    fetching samples in parallel gain as they would there. Made per process and
    thread (DataLoader workers are forked after the data set is built).
    """

    def __init__(self, read_delay_s: float = 0.0, write_bytes_per_s: float = 0.0) -> None:
        self.read_delay_s = read_delay_s
        self.write_bytes_per_s = write_bytes_per_s
        self._local = threading.local()

    def __getstate__(self) -> dict[str, float]:
        # Spawned workers get the settings; their own channels start on first read.
        return {"read_delay_s": self.read_delay_s, "write_bytes_per_s": self.write_bytes_per_s}

    def __setstate__(self, state: dict[str, float]) -> None:
        self.__init__(state["read_delay_s"], state["write_bytes_per_s"])  # type: ignore[misc]

    def _channel(self) -> tuple[queue.SimpleQueue[str], int]:
        """This thread's request queue and the pipe end it reads."""
        local = self._local
        if getattr(local, "pid", None) != os.getpid():
            requests: queue.SimpleQueue[str] = queue.SimpleQueue()
            rfd, wfd = os.pipe()
            threading.Thread(
                target=self._serve, args=(requests, wfd), name="slow-disk", daemon=True
            ).start()
            local.requests, local.rfd, local.pid = requests, rfd, os.getpid()
        return local.requests, local.rfd

    def _serve(self, requests: queue.SimpleQueue[str], wfd: int) -> None:
        while True:
            path = requests.get()
            time.sleep(self.read_delay_s)
            data = Path(path).read_bytes()
            os.write(wfd, struct.pack("<I", len(data)) + data)

    def read(self, path: str) -> bytes:
        if self.read_delay_s <= 0:
            return Path(path).read_bytes()
        requests, rfd = self._channel()
        requests.put(path)
        (size,) = struct.unpack("<I", _read_exact(rfd, 4))
        return _read_exact(rfd, size)

    def write(self, path: Path, data: bytes) -> None:
        """Write ``data`` to ``path`` no faster than the disk allows."""
        chunk = 256 * 1024
        with open(path, "wb") as f:
            for start in range(0, len(data), chunk):
                f.write(data[start : start + chunk])
                if self.write_bytes_per_s > 0:
                    time.sleep(len(data[start : start + chunk]) / self.write_bytes_per_s)


def _read_exact(fd: int, n: int) -> bytes:
    parts = []
    while n > 0:
        chunk = os.read(fd, n)
        if not chunk:
            raise EOFError("slow disk closed")
        parts.append(chunk)
        n -= len(chunk)
    return b"".join(parts)


class FileDigits(Dataset[tuple[torch.Tensor, int]]):
    """One ``.npy`` file per sample, ``NNNNNN_<label>.npy``, in one directory."""

    def __init__(self, root: Path, disk: SlowDisk, augment: bool) -> None:
        self.files = sorted(str(p) for p in root.glob("*.npy"))
        if not self.files:
            raise SystemExit(f"no .npy files in {root}")
        self.labels = [int(Path(f).stem.rsplit("_", 1)[1]) for f in self.files]
        self.disk = disk
        self.augment = augment

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        image = np.load(io.BytesIO(self.disk.read(self.files[i])))
        x = image[0].astype(np.float32) / 255.0
        if self.augment:
            x = elastic(x, np.random.default_rng(i))
        return torch.from_numpy(x)[None], self.labels[i]


# --- training ----------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=300, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--workers", type=int, default=0, help="DataLoader num_workers")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: default)")
    p.add_argument("--samples", type=int, default=4096, help="data set size")
    p.add_argument("--augment", action="store_true", help="elastic distortion per sample")
    p.add_argument("--dataset-dir", type=Path, default=None, help="read samples from files")
    p.add_argument("--read-delay-ms", type=float, default=0.0, help="latency of every read")
    p.add_argument("--checkpoint-every", type=int, default=0, help="save every N steps")
    p.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints"))
    p.add_argument(
        "--disk-mib-per-s",
        type=float,
        default=0.0,
        help="write speed of the disk (0: as fast as it goes)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=50)
    args = p.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1 or args.samples < args.batch_size:
        p.error("need --steps >= 1 and --samples >= --batch-size >= 1")
    return args


def make_dataset(args: argparse.Namespace, disk: SlowDisk) -> Dataset[Any]:
    if args.dataset_dir is None:
        return InMemoryDigits(args.samples, args.seed, args.augment)
    root: Path = args.dataset_dir
    if not any(root.glob("*.npy")):
        print(f"writing {args.samples} samples to {root}", flush=True)
        write_digits(root, args.samples, args.seed)
    return FileDigits(root, disk, args.augment)


def save_checkpoint(
    disk: SlowDisk, directory: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    buffer = io.BytesIO()
    torch.save(
        {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer
    )
    directory.mkdir(parents=True, exist_ok=True)
    disk.write(directory / f"step-{step:06d}.pt", buffer.getvalue())


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    disk = SlowDisk(args.read_delay_ms / 1000.0, args.disk_mib_per_s * 2**20)
    dataset = make_dataset(args, disk)
    loader = DataLoader(
        dataset,
        batch_size=args.batch_size,
        shuffle=True,
        drop_last=True,
        num_workers=args.workers,
        persistent_workers=args.workers > 0,
        generator=torch.Generator().manual_seed(args.seed),
    )
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    criterion = nn.CrossEntropyLoss()
    model.train()
    step, losses, correct, seen = 0, [], 0, 0
    started = time.perf_counter()
    for epoch in range(math.ceil(args.steps / len(loader))):
        for data, target in loader:
            optimizer.zero_grad()
            output = model(data)
            loss = criterion(output, target)
            loss.backward()
            optimizer.step()
            step += 1
            losses.append(loss.item())
            correct += int((output.argmax(1) == target).sum())
            seen += len(target)
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                save_checkpoint(disk, args.checkpoint_dir, step, model, optimizer)
            if step % args.log_every == 0 or step == args.steps:
                mean = sum(losses) / len(losses)
                print(
                    f"epoch {epoch} step {step}/{args.steps} loss {mean:.3f} "
                    f"accuracy {correct / seen:.1%} ({time.perf_counter() - started:.1f} s)",
                    flush=True,
                )
                losses, correct, seen = [], 0, 0
            if step == args.steps:
                break
    print(f"done: {step} steps in {time.perf_counter() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
