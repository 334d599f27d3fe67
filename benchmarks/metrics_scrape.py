"""What a Prometheus scrape of ``trainmedic run --prometheus`` costs the supervisor.

A :class:`~trainmedic.supervise.live.metrics.MetricsState` is fed as a large node
would feed it (``--ranks`` ranks stepping, ``--gpus`` GPUs), then scraped over
HTTP on 127.0.0.1 ``--scrapes`` times while a feeder thread keeps adding steps
at ``--rate`` steps/s per rank. Reported: the scrape's latency (median, p99)
and the supervisor's CPU per scrape, and how long the feeder's appends wait
for the lock during scrapes compared with without (the exporter must never
hold up the records).

    python benchmarks/metrics_scrape.py --ranks 64 --gpus 8 --scrapes 200
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
import urllib.request

from trainmedic.gpu.types import GpuSample
from trainmedic.record.types import RunEvent, StepRecord
from trainmedic.supervise.live.metrics import MetricsState
from trainmedic.supervise.live.metrics_server import ListenAddress, start_exporter


def feed(state: MetricsState, ranks: int, rate: float, stop: threading.Event,
         waits: list[float]) -> None:  # fmt: skip
    k = 0
    while not stop.is_set():
        k += 1
        t = time.time()
        for r in range(ranks):
            began = time.perf_counter()
            state.add_step(StepRecord(step=k, t=t, duration_s=1 / rate, data_wait_s=0.001,
                                      compute_s=0.8 / rate, samples=32, pid=1000 + r, rank=r))
            waits.append(time.perf_counter() - began)
        stop.wait(1 / rate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--rate", type=float, default=20.0)
    args = parser.parse_args()
    state = MetricsState("bench", node="bench")
    for r in range(args.ranks):
        state.add_event(RunEvent(0.0, "process_start", "", pid=1000 + r,
                                 data={"rank": r, "local_rank": r % 8}))
    for i in range(args.gpus):
        state.add_gpu(GpuSample(timestamp=time.time(), index=i, name="H100", uuid=f"GPU-{i}",
                                utilization_gpu_pct=90.0, memory_used_bytes=1 << 35,
                                memory_total_bytes=1 << 36, temperature_c=60.0,
                                power_draw_w=500.0, sm_clock_mhz=1900.0,
                                clock_event_reasons=0))
    stop = threading.Event()
    quiet: list[float] = []
    feeder = threading.Thread(target=feed, args=(state, args.ranks, args.rate, stop, quiet))
    feeder.start()
    time.sleep(3.0)  # windows fill (50 steps per rank at 20 steps/s: 2.5 s)
    quiet_waits = list(quiet)
    quiet.clear()
    exporter = start_exporter(state, ListenAddress("127.0.0.1", 0))
    latencies, cpu = [], []
    size = 0
    for _ in range(args.scrapes):
        c0, t0 = time.process_time(), time.perf_counter()
        with urllib.request.urlopen(exporter.url, timeout=10) as r:
            size = len(r.read())
        latencies.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    stop.set()
    feeder.join()
    exporter.close()
    latencies.sort()
    busy = sorted(quiet)
    calm = sorted(quiet_waits)
    print(f"ranks={args.ranks} gpus={args.gpus} scrapes={args.scrapes} bytes/scrape={size}")
    print(f"scrape latency: median {statistics.median(latencies) * 1e3:.2f} ms, "
          f"p99 {latencies[int(0.99 * (len(latencies) - 1))] * 1e3:.2f} ms")
    print(f"process CPU per scrape (server + this client): {statistics.fmean(cpu) * 1e3:.2f} ms")
    busy_p99 = busy[int(0.99 * (len(busy) - 1))]
    calm_p99 = calm[int(0.99 * (len(calm) - 1))]
    print(f"add_step while scraped: median {statistics.median(busy) * 1e6:.1f} us, "
          f"p99 {busy_p99 * 1e6:.1f} us; without scrapes: median "
          f"{statistics.median(calm) * 1e6:.1f} us, p99 {calm_p99 * 1e6:.1f} us")


if __name__ == "__main__":
    main()
