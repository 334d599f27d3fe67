"""Trace events as torch.profiler writes them, for hand-built traces."""

from __future__ import annotations

from typing import Any


def x(cat: str, name: str, ts: float, dur: float, tid: int = 1, **args: Any) -> dict[str, Any]:
    """One complete event as torch.profiler writes it."""
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": args}  # fmt: skip


def item_each_step(steps: int = 3) -> list[dict[str, Any]]:
    """A step that launches one kernel, then reads the loss with ``.item()`` from
    ``train.py``'s ``train_step`` (frames named the way ``with_stack=True`` names them:
    the file, the line where the function starts, the function)."""
    events = [x("python_function", "train.py(1): <module>", 0, 10_000)]
    for n in range(steps):
        t = 1000 * n
        events += [
            x("user_annotation", f"ProfilerStep#{n}", t, 1000),
            x("python_function", "train.py(30): train_step", t + 10, 900),
            x("python_function", "torch/nn/modules/module.py(1736): _call_impl", t + 20, 50),
            x("cuda_runtime", "cudaLaunchKernel", t + 30, 5),
            x("kernel", "gemm", t + 40, 500, device=0),  # runs 40..540
            x("python_function", "<built-in method item of Tensor object at 0x7f0>", t + 100, 460),
            x("cpu_op", "aten::item", t + 101, 458),
            x("cpu_op", "aten::_local_scalar_dense", t + 102, 456),
            x("cuda_runtime", "cudaMemcpyAsync", t + 103, 4),
            # the host waits 440 µs for the gemm, returns at 550; the next kernel at 700
            x("cuda_runtime", "cudaStreamSynchronize", t + 110, 440),
            x("cuda_runtime", "cudaLaunchKernel", t + 690, 5),
            x("kernel", "relu", t + 700, 100, device=0),
            x("cuda_runtime", "cudaFree", t + 850, 20),
            x("cuda_runtime", "cudaMalloc", t + 880, 30),
        ]
    # a synchronisation outside the steps (saving a checkpoint) is no step's
    events.append(x("cuda_runtime", "cudaDeviceSynchronize", 5000, 100))
    return events
