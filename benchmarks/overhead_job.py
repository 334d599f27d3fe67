"""The benchmark's training job: one of ``bench_models``' small CPU models, ms-scale steps.

An ordinary script (it knows nothing about trainmedic). It times its own
training loop and prints one line ``BENCH {json}`` at the end: steps, loop
seconds, per-step percentiles, and the CPU per step of the training thread
and of the whole process (all its threads), so the driver compares loops,
not Python start-up. ``--profiler`` records the whole loop with ``torch.profiler.profile()``
(default activities: CPU, plus CUDA when available; no schedule, so every op
of every step is recorded), the way a person would profile a script.

    python benchmarks/overhead_job.py --model mlp --steps 3000 [--profiler]
        [--times-out FILE]

It also counts context switches during the loop (``/proc/self/task/*/status``):
the training thread's voluntary ones (it blocked: mostly waiting for the
interpreter lock another thread of the job holds, as a plain loop with no
workers does no I/O), its involuntary ones (preempted), and the voluntary ones
of every other thread of the process (their wake-ups).

``--until FILE`` trains until FILE exists (looked for every 16 steps, in place
of ``--steps``), ``--started FILE`` is created when the loop begins, and
``--stamps-out FILE`` writes every step's end (``time.perf_counter()``, one a
line, the first line the loop's start): what ``turns.py`` needs to count only
the steps taken while the job had the machine.

With ``OVERHEAD_JOB_FLOOR=1`` in its environment the job installs the two bare
hooks of :func:`install_floor_hooks` before its loop: what any per-step probe at
those two call sites costs at least (``turns.py --floor``).

``--times-out`` writes every step's time (seconds, one a line) and, to
``FILE.end``, the loop's last ``time.perf_counter()`` (the system's monotonic
clock, so that steps can be lined up with what other processes did when).
"""

import argparse
import contextlib
import json
import os
import statistics
import threading
import time

import torch
from bench_models import build


def switches():
    """{thread id: (voluntary, involuntary)} context switches of this process's threads."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if "ctxt_switches" in line)
        except OSError:
            continue  # the thread ended
        out[int(tid)] = (
            int(fields["voluntary_ctxt_switches"]),
            int(fields["nonvoluntary_ctxt_switches"]),
        )
    return out


def switch_rates(before, after, seconds):
    """(training thread voluntary/s, its involuntary/s, other threads' voluntary/s)."""
    me = threading.get_native_id()
    mine = after.get(me, (0, 0))
    base = before.get(me, (0, 0))
    others = sum(v - before.get(tid, (0, 0))[0] for tid, (v, _) in after.items() if tid != me)
    return (mine[0] - base[0]) / seconds, (mine[1] - base[1]) / seconds, others / seconds


FLOOR_ENV = "OVERHEAD_JOB_FLOOR"


def install_floor_hooks():
    """The least a probe that times each step and its batch fetch adds to a step: a
    Python wrapper around the DataLoader iterator's ``__next__`` with two clock reads,
    and an optimizer post-step hook that writes (end, length, data wait) into a
    fixed-size ring - one wrapper frame and one hook frame a step, no thread, no
    bookkeeping, no reader (the benchmark's floor for trainmedic's two per-step
    hooks)."""
    import struct

    clock = time.perf_counter
    iter_cls = torch.utils.data.dataloader._BaseDataLoaderIter
    original_next = iter_cls.__next__
    wait = [0.0]

    def __next__(self):
        t0 = clock()
        batch = original_next(self)
        wait[0] += clock() - t0
        return batch

    iter_cls.__next__ = __next__
    slots = 4096
    ring = bytearray(24 * slots)
    pack = struct.Struct("<ddd").pack_into
    state = [0, clock()]  # steps written, the last step's end

    def post_hook(optimizer, args, kwargs):
        now = clock()
        n = state[0]
        pack(ring, (n % slots) * 24, now, now - state[1], wait[0])
        state[0] = n + 1
        state[1] = now
        wait[0] = 0.0

    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(post_hook)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--profiler", action="store_true")
    parser.add_argument("--times-out", help="write every step's time (seconds, one a line) here")
    parser.add_argument("--until", help="train until this file exists (instead of --steps)")
    parser.add_argument("--started", help="create this file when the loop begins")
    parser.add_argument("--stamps-out", help="write every step's end (perf_counter) here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    job = build(args.model)
    if os.environ.get(FLOOR_ENV) == "1":
        install_floor_hooks()
    profiler = torch.profiler.profile() if args.profiler else contextlib.nullcontext()
    step_times = []
    step = 0
    until = args.until
    steps = args.steps if until is None else max(args.steps, 10**9)
    with profiler:
        switches0 = switches()
        thread0, process0 = time.thread_time(), time.process_time()
        start = last = time.perf_counter()
        if args.started:
            open(args.started, "w").close()
        while step < steps:
            for x, y in job.loader:
                job.step(x, y)
                now = time.perf_counter()
                step_times.append(now - last)
                last = now
                step += 1
                if step == steps or (until and step % 16 == 0 and os.path.exists(until)):
                    steps = step
                    break
        loop_s = time.perf_counter() - start
        thread_s = time.thread_time() - thread0
        process_s = time.process_time() - process0
        switches1 = switches()
        waits, preempted, wakes = switch_rates(switches0, switches1, loop_s)
        names = {t.native_id: t.name for t in threading.enumerate()}
        by_thread = {
            names.get(tid, str(tid)): round((v - switches0.get(tid, (0, 0))[0]) / loop_s, 2)
            for tid, (v, _) in switches1.items()
            if tid != threading.get_native_id()
        }
    if args.stamps_out:
        ends = [start]
        for t in step_times:
            ends.append(ends[-1] + t)
        with open(args.stamps_out, "w") as f:
            f.write("".join(f"{t!r}\n" for t in ends))
    if args.times_out:
        with open(args.times_out, "w") as f:
            f.write("".join(f"{t!r}\n" for t in step_times))
        with open(args.times_out + ".end", "w") as f:
            f.write(repr(last))
    step_times.sort()
    print(
        "BENCH "
        + json.dumps(
            {
                "steps": step,
                "loop_s": loop_s,
                "step_mean_s": loop_s / step,
                "step_median_s": statistics.median(step_times),
                "step_p90_s": step_times[int(0.9 * len(step_times))],
                "thread_cpu_per_step_s": thread_s / step,
                "process_cpu_per_step_s": process_s / step,
                "train_blocked_per_s": waits,
                "train_preempted_per_s": preempted,
                "other_wakes_per_s": wakes,
                "wakes_by_thread": by_thread,
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
