"""A run as a Chrome trace (JSON), for chrome://tracing and ui.perfetto.dev.

Layout of the timeline (times in microseconds since the run started):

* one process per training process (its pid), with a ``steps`` track: one
  complete event (``ph: "X"``) per exact step, with nested ``data wait`` and
  ``compute`` slices, and one per folded window of ordinary steps (its means
  in ``args``); the process's events are instants (``ph: "i"``) on it;
* a ``GPUs`` process with counters (``ph: "C"``) per GPU: utilization and
  memory used;
* a ``host`` process with counters for the job's CPU and the machine's CPU;
* a ``run`` process holding events that belong to no training process.

Format: the Trace Event Format's JSON object form, ``{"traceEvents": [...]}``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from trainmedic.atomicfile import atomic_writer
from trainmedic.record.types import RunRecord, StepRecord, StepWindow

# Pseudo process ids for tracks that are not a training process: above Linux's
# largest pid (2**22), so they never collide with a real one.
GPU_PID = 5_000_001
HOST_PID = 5_000_002
RUN_PID = 5_000_003
STEPS_TID = 1
_GIB = 1024**3


def write_chrome_trace(record: RunRecord, path: Path) -> None:
    """Write ``record`` as a Chrome trace JSON file at ``path`` (replaced atomically)."""
    with atomic_writer(path) as f:
        dump_chrome_trace(record, f)


def dump_chrome_trace(record: RunRecord, f: IO[str]) -> None:
    """Write ``record`` as Chrome trace JSON into the text file ``f``.

    ``otherData.generator`` marks the file as trainmedic's (so a later export
    may replace it).
    """
    f.write('{"displayTimeUnit":"ms","otherData":{"generator":"trainmedic"},"traceEvents":[\n')
    for i, event in enumerate(trace_events(record)):
        if i:
            f.write(",\n")
        f.write(json.dumps(event, separators=(",", ":"), ensure_ascii=False, default=repr))
    f.write("\n]}\n")


def trace_events(record: RunRecord) -> Iterator[dict[str, Any]]:
    """Every trace event of ``record``: metadata first, then slices, instants, counters."""
    t0 = record.meta.started_at

    def us(t: float) -> float:
        return round((t - t0) * 1e6, 3)

    pids = sorted(
        {s.pid for s in record.steps}
        | {w.pid for w in record.windows}
        | {e.pid for e in record.events if e.pid is not None}
    )
    ranks = {s.pid: s.rank for s in record.steps if s.rank is not None}
    for order, pid in enumerate(pids):
        rank = ranks.get(pid)
        label = f"pid {pid}" + ("" if rank is None else f" (rank {rank})")
        yield _meta("process_name", pid, {"name": label})
        yield _meta("process_sort_index", pid, {"sort_index": order})
        yield _meta("thread_name", pid, {"name": "steps"}, tid=STEPS_TID)
    for pid, name in ((GPU_PID, "GPUs"), (HOST_PID, "host"), (RUN_PID, "run")):
        yield _meta("process_name", pid, {"name": name})
        yield _meta("process_sort_index", pid, {"sort_index": len(pids) + pid - GPU_PID})

    for step in record.steps:
        yield from _step_slices(step, us)
    for window in record.windows:
        if window.count > 0:
            yield _window_slice(window, us)
    for e in record.events:
        yield {
            "name": e.kind,
            "cat": "event",
            "ph": "i",
            "s": "p" if e.pid is not None else "g",
            "ts": us(e.t),
            "pid": RUN_PID if e.pid is None else e.pid,
            "tid": STEPS_TID,
            "args": {"message": e.message, **({"data": dict(e.data)} if e.data else {})},
        }
    for g in record.gpu:
        if g.utilization_gpu_pct is not None:
            yield _counter(
                f"gpu{g.index} utilization",
                GPU_PID,
                us(g.timestamp),
                {"percent": g.utilization_gpu_pct},
            )
        if g.memory_used_bytes is not None:
            yield _counter(
                f"gpu{g.index} memory used",
                GPU_PID,
                us(g.timestamp),
                {"GiB": round(g.memory_used_bytes / _GIB, 3)},
            )
    for h in record.host:
        cpu = {"job": round(h.job_cpu_pct / 100, 3)}
        if h.others_cpu_pct is not None:
            cpu["others"] = round(h.others_cpu_pct / 100, 3)
        yield _counter("CPU cores", HOST_PID, us(h.t), cpu)
        yield _counter("system CPU", HOST_PID, us(h.t), {"percent": h.system_cpu_pct})


def _step_slices(step: StepRecord, us: Callable[[float], float]) -> Iterator[dict[str, Any]]:
    start = step.t - step.duration_s
    args: dict[str, Any] = {"step": step.step, "duration_ms": round(step.duration_s * 1e3, 3)}
    optional = {
        "data_wait_ms": step.data_wait_s * 1e3,
        "compute_ms": None if step.compute_s is None else step.compute_s * 1e3,
        "gpu_time_ms": None if step.gpu_time_s is None else step.gpu_time_s * 1e3,
        "samples": step.samples,
        "rank": step.rank,
        "alloc_retries": step.alloc_retries,
        "ooms": step.ooms,
    }
    args.update({k: round(v, 3) for k, v in optional.items() if v is not None})
    name = f"step {step.step}" if step.phase == "train" else f"{step.phase} {step.step}"
    yield _slice(name, "step", step.pid, us(start), step.duration_s * 1e6, args)
    # The loop waits for its batch first, then runs forward/backward/optimizer.
    wait = min(step.data_wait_s, step.duration_s)
    if wait > 0:
        yield _slice("data wait", "data_wait", step.pid, us(start), wait * 1e6, {})
    if step.compute_s is not None and step.compute_s > 0:
        compute = min(step.compute_s, step.duration_s - wait)
        if compute > 0:
            yield _slice("compute", "compute", step.pid, us(start + wait), compute * 1e6, {})


def _window_slice(w: StepWindow, us: Callable[[float], float]) -> dict[str, Any]:
    args: dict[str, Any] = {
        "steps": w.count,
        "first_step": w.first_step,
        "last_step": w.last_step,
        "mean_ms": round(w.duration_sum_s / w.count * 1e3, 3),
        "min_ms": round(w.duration_min_s * 1e3, 3),
        "max_ms": round(w.duration_max_s * 1e3, 3),
        "mean_data_wait_ms": round(w.data_wait_sum_s / w.count * 1e3, 3),
    }
    if w.samples_sum is not None:
        args["samples"] = w.samples_sum
    name = f"{w.count} steps" + ("" if w.phase == "train" else f" ({w.phase})")
    return _slice(name, "window", w.pid, us(w.t_start), (w.t - w.t_start) * 1e6, args)


def _slice(
    name: str, cat: str, pid: int, ts: float, dur: float, args: dict[str, Any]
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "name": name,
        "cat": cat,
        "ph": "X",
        "ts": ts,
        "dur": round(max(dur, 0.0), 3),
        "pid": pid,
        "tid": STEPS_TID,
    }
    if args:
        event["args"] = args
    return event


def _counter(name: str, pid: int, ts: float, values: dict[str, float]) -> dict[str, Any]:
    return {"name": name, "ph": "C", "ts": ts, "pid": pid, "args": values}


def _meta(name: str, pid: int, args: dict[str, Any], tid: int = 0) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}
