"""What one host reading costs the supervisor, with the job's threads' scheduler counters.

Starts a stand-in job (a process tree: a main process with T threads and W
child processes with T threads each, all sleeping), then times
``HostSampler.read()`` — the process tree's CPU and memory, system CPU, disks,
network, the cgroup, the process census and every thread's
``/proc/<pid>/task/<tid>/schedstat`` — by its own thread CPU, and prints the
cost per reading and the share of one core at one reading a second, with and
without the thread counters.

    .venv/bin/python benchmarks/sampler_cost.py [--threads 16 64] [--workers 0 8] [--reads 50]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

import psutil

from trainmedic.supervise.observe.census import ProcessCensus
from trainmedic.supervise.observe.samplers import HostSampler
from trainmedic.supervise.observe.threads import ThreadSampler

JOB = """
import os, sys, threading, time
threads, workers = int(sys.argv[1]), int(sys.argv[2])
def park():
    for _ in range(threads - 1):
        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
for _ in range(workers):
    if os.fork() == 0:
        park(); time.sleep(3600); os._exit(0)
park()
print("ready", flush=True)
time.sleep(3600)
"""


def measure(threads: int, workers: int, reads: int) -> tuple[float, float, int]:
    job = subprocess.Popen(
        [sys.executable, "-c", JOB, str(threads), str(workers)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert job.stdout is not None and job.stdout.readline().strip() == "ready"
        time.sleep(0.5 + 0.02 * threads * workers)  # the forked workers park their threads
        costs = {}
        for with_threads in (False, True):
            roles = {job.pid: "train"}
            sampler = HostSampler(
                job.pid,
                lambda s: None,
                threads=ThreadSampler(lambda r=roles: r, budget=1.0) if with_threads else None,
                census=ProcessCensus(time.time()),
            )
            sampler.read()
            samples = []
            for _ in range(reads):
                t0 = time.thread_time()
                sampler.read()
                samples.append(time.thread_time() - t0)
            costs[with_threads] = statistics.median(samples)
        tasks = sum(
            p.num_threads() for p in [psutil.Process(job.pid), *psutil.Process(job.pid).children()]
        )
        return costs[False], costs[True], tasks
    finally:
        os.killpg(job.pid, signal.SIGKILL)  # the job and its forked workers: one group
        job.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 8])
    parser.add_argument("--reads", type=int, default=50)
    args = parser.parse_args()
    print(
        "| threads per process | workers | job threads | reading without "
        "| with thread counters | share of a core at 1 Hz |"
    )
    print("|---|---|---|---|---|---|")
    for t in args.threads:
        for w in args.workers:
            plain, full, tasks = measure(t, w, args.reads)
            print(
                f"| {t} | {w} | {tasks} | {plain * 1e3:.2f} ms | {full * 1e3:.2f} ms | {full:.2%} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
