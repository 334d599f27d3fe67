"""The real :class:`~.machine.StressMachine`: torch.cuda on the GPUs.

torch is imported only when a machine is opened (torch is not a requirement of
trainmedic). Sizes are chosen to saturate a data-centre GPU: square matmuls of
:data:`MATMUL_N` (cuBLAS reaches its plateau there on A100/H100/H200), 1 GiB device
copies, 256 MiB host and peer copies. Each figure is timed on the GPU with CUDA events,
after warm-up calls, over as many calls as fill the burst (the count is calibrated
once per GPU and dtype); host and peer copies, whose pageable staging runs on the host,
are timed on the host around a synchronize. The same matmuls serve the pass with every
GPU at once and the one-GPU-at-a-time pass (``matmul([i], ...)``); the call counts
calibrated in the first serve the second (operands are held for one dtype at a time).
While a burst runs, the runner's thread reads NVML (:mod:`.sampling`): the burst waits on
CUDA events, which releases the GIL.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from trainmedic.doctor.stress.datasheet import DTYPES
from trainmedic.doctor.stress.machine import (
    MAX_ERROR_OFFSETS,
    MEMTEST_PATTERNS,
    Direction,
    MemtestOutcome,
    Work,
)
from trainmedic.doctor.stress.runner import NoGpuToStress
from trainmedic.gpu.types import GpuSample
from trainmedic.gpu.visible import nvml_gpu_for_cuda_device

MATMUL_N = 8192
"""Side of the square matmuls (2 * N^3 FLOP each: 1.1 TFLOP)."""
WARMUP_CALLS = 3
CALIBRATION_CALLS = 5
COPY_BYTES = 1 << 30
"""Size of each device-to-device copy, bytes (at most 1/8 of the free memory)."""
HOST_BYTES = 256 << 20
PEER_BYTES = 256 << 20
MEMTEST_CHUNK_WORDS = 16 << 20
"""The memory test checks 64 MiB at a time, so its temporaries stay small."""
LAUNCH_ROUND = 16
"""Calls launched on one GPU before turning to the next, so all GPUs start together."""

_FILL = {"0x00000000": 0, "0xffffffff": -1, "0x55555555": 0x55555555, "0xaaaaaaaa": -0x55555556}
"""The fixed patterns as signed 32-bit values (``0xaaaaaaaa`` is ``-0x55555556``)."""


def open_torch_machine(samples: Sequence[GpuSample]) -> tuple[str, TorchStressMachine]:
    """The machine over the NVML GPUs ``samples`` reads, each found as a CUDA device.

    Raises:
        NoGpuToStress: torch is missing, cannot use CUDA, or a GPU is not visible to it.
    """
    try:
        import torch
    except ImportError:
        raise NoGpuToStress(
            "no GPU to stress from this Python: torch is not installed (pip install torch)"
        ) from None
    if not torch.cuda.is_available():
        raise NoGpuToStress(
            f"no GPU to stress from this Python: torch {torch.__version__} cannot use CUDA "
            "(a CPU-only build, or a driver older than its CUDA)"
        )
    ordinals = {s.index: _cuda_ordinal(torch, s) for s in samples}
    hidden = [i for i, o in ordinals.items() if o is None]
    if hidden:
        raise NoGpuToStress(
            f"GPU {hidden[0]} is not visible to CUDA in this process (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): choose GPUs with --gpus"
        )
    return "torch.cuda", TorchStressMachine(
        torch, {i: o for i, o in ordinals.items() if o is not None}
    )


def _cuda_ordinal(torch: Any, sample: GpuSample) -> int | None:
    """The CUDA ordinal of the NVML GPU ``sample``: by UUID, else by CUDA's own order."""
    for ordinal in range(torch.cuda.device_count()):
        uuid = getattr(torch.cuda.get_device_properties(ordinal), "uuid", None)
        if uuid is not None and sample.uuid and sample.uuid.lower() == f"gpu-{uuid}".lower():
            return ordinal
    for ordinal in range(torch.cuda.device_count()):
        found = nvml_gpu_for_cuda_device(ordinal, os.environ, [sample])
        if found is not None and found.index == sample.index:
            return ordinal
    return None


class TorchStressMachine:
    """Bursts of matmuls and copies on CUDA devices; see the module docstring."""

    def __init__(
        self,
        torch: Any,
        ordinals: Mapping[int, int],
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._torch = torch
        self._ordinals = dict(ordinals)
        self._clock = clock
        self._tf32 = torch.backends.cuda.matmul.allow_tf32
        self._calls: dict[tuple[int, str], Callable[[], Any]] = {}
        self._per_call_s: dict[tuple[int, str], float] = {}
        self._work: dict[tuple[int, str], float] = {}
        self._dtype: str | None = None
        self._buffers: dict[tuple[int, Any], tuple[Any, Any]] = {}

    def _device(self, index: int) -> Any:
        return self._torch.device("cuda", self._ordinals[index])

    # ---- what each GPU can run

    def dtypes(self, index: int) -> dict[str, str | None]:
        torch = self._torch
        cc = tuple(torch.cuda.get_device_capability(self._ordinals[index]))
        out: dict[str, str | None] = {"fp32": None, "fp16": None}
        for d in ("bf16", "tf32"):
            out[d] = None if cc >= (8, 0) else "needs compute capability 8.0 (Ampere)"
        if cc < (8, 9):
            out["fp8"] = "needs compute capability 8.9 (Ada) or 9.0 (Hopper)"
        elif not (hasattr(torch, "float8_e4m3fn") and hasattr(torch, "_scaled_mm")):
            out["fp8"] = f"torch {torch.__version__} has no float8 matmul (torch._scaled_mm)"
        else:
            out["fp8"] = self._try_fp8(index)
        return {d: out[d] for d in DTYPES if d in out}

    def _try_fp8(self, index: int) -> str | None:
        torch = self._torch
        dev = self._device(index)
        try:
            a = torch.ones(32, 32, device=dev).to(torch.float8_e4m3fn)
            one = torch.ones((), device=dev)
            torch._scaled_mm(a, a.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            torch.cuda.synchronize(dev)
        except Exception as exc:  # an unsupported kernel surfaces as RuntimeError
            return f"torch._scaled_mm failed: {' '.join(str(exc).split())[:160]}"
        return None

    # ---- the bursts

    def _matmul_call(self, index: int, dtype: str) -> tuple[Callable[[], Any], float]:
        """The call and its FLOP; operands of another dtype are freed first."""
        key = (index, dtype)
        if key in self._calls:
            return self._calls[key], self._work[key]
        torch = self._torch
        dev, n = self._device(index), MATMUL_N
        if dtype == "fp8":
            a = torch.randn(n, n, device=dev, dtype=torch.bfloat16).to(torch.float8_e4m3fn)
            b = torch.randn(n, n, device=dev, dtype=torch.bfloat16).to(torch.float8_e4m3fn).t()
            one = torch.ones((), device=dev)

            def call() -> Any:
                return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

        else:
            kind = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(dtype, torch.float32)
            a = torch.randn(n, n, device=dev, dtype=kind)
            b = torch.randn(n, n, device=dev, dtype=kind)
            c = torch.empty(n, n, device=dev, dtype=kind)

            def call() -> Any:
                return torch.matmul(a, b, out=c)

        self._calls[key], self._work[key] = call, 2.0 * n**3
        return call, self._work[key]

    def _copy_call(self, index: int, kind: str) -> tuple[Callable[[], Any], float]:
        key = (index, kind)
        if key in self._calls:
            return self._calls[key], self._work[key]
        torch = self._torch
        dev = self._device(index)
        free, _ = torch.cuda.mem_get_info(dev)
        size = max(1 << 20, min(COPY_BYTES, free // 8))
        src = torch.empty(size, dtype=torch.uint8, device=dev).fill_(7)
        dst = torch.empty_like(src)

        def call() -> Any:
            return dst.copy_(src)

        self._calls[key], self._work[key] = call, 2.0 * size  # each byte read and written
        return call, self._work[key]

    def _use(self, dtype: str) -> None:
        """Free the previous dtype's operands and set TF32 for this one."""
        if self._dtype != dtype:
            for key in [k for k in self._calls if k[1] in DTYPES]:
                del self._calls[key]
            self._torch.cuda.empty_cache()
            self._dtype = dtype
        self._torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"

    def _calibrate(self, index: int, name: str, call: Callable[[], Any]) -> float:
        key = (index, name)
        if key not in self._per_call_s:
            torch = self._torch
            with torch.cuda.device(self._ordinals[index]):
                for _ in range(WARMUP_CALLS):
                    call()
                start, end = (
                    torch.cuda.Event(enable_timing=True),
                    torch.cuda.Event(enable_timing=True),
                )
                start.record()
                for _ in range(CALIBRATION_CALLS):
                    call()
                end.record()
                end.synchronize()
            self._per_call_s[key] = max(1e-6, start.elapsed_time(end) / 1000 / CALIBRATION_CALLS)
        return self._per_call_s[key]

    def _burst(
        self,
        indices: Sequence[int],
        name: str,
        seconds: float,
        make: Callable[[int], tuple[Callable[[], Any], float]],
    ) -> dict[int, Work]:
        torch = self._torch
        calls = {i: make(i) for i in indices}
        counts = {
            i: max(1, math.ceil(seconds / self._calibrate(i, name, calls[i][0]))) for i in indices
        }
        events = {
            i: (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for i in indices
        }
        done = dict.fromkeys(indices, 0)
        for i in indices:
            with torch.cuda.device(self._ordinals[i]):
                events[i][0].record()
        while any(done[i] < counts[i] for i in indices):
            for i in indices:
                todo = min(LAUNCH_ROUND, counts[i] - done[i])
                if todo <= 0:
                    continue
                with torch.cuda.device(self._ordinals[i]):
                    for _ in range(todo):
                        calls[i][0]()
                    done[i] += todo
                    if done[i] == counts[i]:
                        events[i][1].record()
        out = {}
        for i in indices:
            events[i][1].synchronize()
            seconds_i = events[i][0].elapsed_time(events[i][1]) / 1000
            out[i] = Work(calls[i][1] * counts[i], seconds_i)
        return out

    def matmul(self, indices: Sequence[int], dtype: str, seconds: float) -> dict[int, Work]:
        self._use(dtype)
        return self._burst(indices, dtype, seconds, lambda i: self._matmul_call(i, dtype))

    def device_copy(self, indices: Sequence[int], seconds: float) -> dict[int, Work]:
        self._use("copy")
        return self._burst(indices, "copy", seconds, lambda i: self._copy_call(i, "copy"))

    def memtest(self, index: int, share: float, seconds: float) -> MemtestOutcome:
        torch = self._torch
        self._use("memtest")
        self._calls.clear()  # the copy buffers too: the test takes a share of all that is free
        torch.cuda.empty_cache()
        dev = self._device(index)
        started = self._clock()
        free, _ = torch.cuda.mem_get_info(dev)
        buf = None
        words = int(free * share) // 4
        for _ in range(8):  # the allocator's own reserve may refuse the first size
            try:
                buf = torch.empty(words, dtype=torch.int32, device=dev)
                break
            except torch.cuda.OutOfMemoryError:
                words = int(words * 0.9)
        if buf is None:
            return MemtestOutcome(0, 0.0, MEMTEST_PATTERNS, 0, 0, (), self._clock() - started)
        base = torch.arange(min(words, MEMTEST_CHUNK_WORDS), dtype=torch.int32, device=dev)
        errors = torch.zeros((), dtype=torch.int64, device=dev)
        offsets: list[int] = []
        passes = 0
        while passes == 0 or self._clock() - started < seconds:
            for pattern in MEMTEST_PATTERNS:
                bad = self._check_pattern(buf, base, pattern, errors)
                if bad and len(offsets) < MAX_ERROR_OFFSETS:
                    offsets.extend(
                        self._offsets(buf, base, pattern, MAX_ERROR_OFFSETS - len(offsets))
                    )
            passes += 1
        count = int(errors.item())
        del buf, base
        torch.cuda.empty_cache()
        return MemtestOutcome(
            tested_bytes=words * 4,
            share_of_free=round(words * 4 / free, 4) if free else 0.0,
            patterns=MEMTEST_PATTERNS,
            passes=passes,
            errors=count,
            error_offsets=tuple(sorted(set(offsets)))[:MAX_ERROR_OFFSETS],
            seconds=self._clock() - started,
        )

    def _expected(self, base: Any, pattern: str, chunk: int, length: int) -> Any:
        if pattern == "address":
            # Each chunk's words hold their index plus a per-chunk shift: a wrong address
            # line reads another chunk's or word's value.
            return base[:length] + (chunk * 7919) % (1 << 30)
        return _FILL[pattern]

    def _chunks(self, buf: Any) -> list[tuple[int, Any]]:
        return list(enumerate(buf.split(MEMTEST_CHUNK_WORDS)))

    def _check_pattern(self, buf: Any, base: Any, pattern: str, errors: Any) -> bool:
        """Write ``pattern`` everywhere, then read it all back; True when a word differs."""
        before = errors.clone()
        for k, chunk in self._chunks(buf):
            expected = self._expected(base, pattern, k, chunk.numel())
            if pattern == "address":
                chunk.copy_(expected)
            else:
                chunk.fill_(expected)
        for k, chunk in self._chunks(buf):
            errors += chunk.ne(self._expected(base, pattern, k, chunk.numel())).sum()
        return bool((errors != before).item())

    def _offsets(self, buf: Any, base: Any, pattern: str, limit: int) -> list[int]:
        out: list[int] = []
        for k, chunk in self._chunks(buf):
            wrong = chunk.ne(self._expected(base, pattern, k, chunk.numel())).nonzero().flatten()
            out.extend(
                int(w) * 4 + k * MEMTEST_CHUNK_WORDS * 4 for w in wrong[: limit - len(out)].tolist()
            )
            if len(out) >= limit:
                break
        return out

    def _host_buffers(self, index: int, pinned: bool) -> tuple[Any, Any]:
        """Kept from one burst to the next (pinning 256 MiB takes a tenth of a second)."""
        key = (index, pinned)
        if key not in self._buffers:
            self._buffers.clear()
            torch = self._torch
            host = torch.empty(HOST_BYTES, dtype=torch.uint8, pin_memory=pinned).fill_(3)
            dev = torch.empty(HOST_BYTES, dtype=torch.uint8, device=self._device(index))
            self._buffers[key] = (host, dev)
        return self._buffers[key]

    def host_copy(self, index: int, direction: Direction, pinned: bool, seconds: float) -> Work:
        torch = self._torch
        host, dev = self._host_buffers(index, pinned)
        src, dst = (host, dev) if direction == "h2d" else (dev, host)
        dst.copy_(src, non_blocking=pinned)  # warm-up: first touch, staging buffers
        torch.cuda.synchronize(self._device(index))
        t0 = self._clock()
        dst.copy_(src, non_blocking=pinned)
        torch.cuda.synchronize(self._device(index))
        one = max(1e-6, self._clock() - t0)
        count = max(1, math.ceil(seconds / one))
        t0 = self._clock()
        for _ in range(count):
            dst.copy_(src, non_blocking=pinned)
        torch.cuda.synchronize(self._device(index))
        return Work(float(HOST_BYTES * count), self._clock() - t0)

    def peer_copy(self, src: int, dst: int, seconds: float) -> Work | None:
        torch = self._torch
        a, b = self._ordinals[src], self._ordinals[dst]
        if not torch.cuda.can_device_access_peer(a, b):
            return None
        key = (-1 - src, dst)  # apart from the host buffers' keys
        if key not in self._buffers:
            self._buffers.clear()
            self._buffers[key] = (
                torch.empty(PEER_BYTES, dtype=torch.uint8, device=self._device(src)).fill_(5),
                torch.empty(PEER_BYTES, dtype=torch.uint8, device=self._device(dst)),
            )
        x, y = self._buffers[key]
        y.copy_(x)  # warm-up: enables peer access on first use
        torch.cuda.synchronize(a)
        torch.cuda.synchronize(b)
        t0 = self._clock()
        y.copy_(x)
        torch.cuda.synchronize(a)
        torch.cuda.synchronize(b)
        count = max(1, math.ceil(seconds / max(1e-6, self._clock() - t0)))
        t0 = self._clock()
        for _ in range(count):
            y.copy_(x)
        torch.cuda.synchronize(a)
        torch.cuda.synchronize(b)
        return Work(float(PEER_BYTES * count), self._clock() - t0)

    def close(self) -> None:
        self._calls.clear()
        self._buffers.clear()
        self._torch.backends.cuda.matmul.allow_tf32 = self._tf32
        self._torch.cuda.empty_cache()
