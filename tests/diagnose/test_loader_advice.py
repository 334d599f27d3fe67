"""Sizing parallel loading from what one sample costs (Little's law), and the speed-up."""

from __future__ import annotations

from collections import Counter

import pytest

from trainmedic.diagnose.loader_advice import (
    LoadingProfile,
    advise,
    fetch_time_s,
    latency_share,
    parallel_fix,
)


def profile(**kw: float) -> LoadingProfile:
    base = {
        "samples_per_step": 32.0,
        "step_s": 1.29,  # 32 samples x 40 ms, in series, + 10 ms of compute
        "wait_s": 1.28,
        "workers": 0,
        "fetch_s": 0.040,
        "latency_share": 0.95,
        "cores": 2.0,
    }
    base.update(kw)
    return LoadingProfile(**base)  # type: ignore[arg-type]


def test_http_latency_needs_samples_in_flight_not_cores() -> None:
    # 40 ms per sample over HTTP, 32 samples per 10 ms step: 3,200 samples/s, and
    # 3,200 x 0.04 s = 128 samples in flight (160 with the margin) on a 2-core machine.
    a = advise(profile(), max_processes=2)
    assert a.samples_per_s == pytest.approx(3200.0)
    assert a.in_flight == 160
    assert a.latency_bound
    # 64 threads a process at most: 3 processes of 54 threads.
    assert a.num_workers == 3 and a.threads_per_worker == 54
    assert a.cores_needed == pytest.approx(3200 * 0.040 * 0.05)
    # The CPU part (2 ms a sample) needs 6.4 cores. The step's CPU work, 64 ms of
    # loading and 10 ms of compute, spread over the 2 cores: 37 ms instead of 1.29 s.
    assert a.new_step_s == pytest.approx(0.037)
    assert a.speedup == pytest.approx(1.29 / 0.037)
    fix = parallel_fix(a, has_loader=True)
    assert "ThreadPoolExecutor(max_workers=54)" in fix and "__getitems__" in fix
    assert "num_workers=3" in fix and "34.9x faster" in fix


def test_pure_latency_is_hidden_completely() -> None:
    a = advise(profile(latency_share=1.0), max_processes=2)
    assert a.new_step_s == pytest.approx(0.01) and a.speedup == pytest.approx(129.0)


def test_cpu_bound_loading_gets_workers_up_to_the_cores() -> None:
    # 3 ms of transform per sample, 64 samples per 0.1 s of compute: 640/s, 1.9 cores.
    p = profile(
        samples_per_step=64, step_s=0.292, wait_s=0.192, fetch_s=0.003, latency_share=0.0, cores=8.0
    )
    a = advise(p, max_processes=7)
    assert not a.latency_bound and a.threads_per_worker == 1
    assert a.cores_needed == pytest.approx(1.92)
    assert a.num_workers == 3  # 1.92 cores x 1.25
    assert a.new_step_s == pytest.approx(0.1)
    few_cores = advise(p.__class__(**{**p.__dict__, "cores": 2.0}), max_processes=2)
    # 192 ms of transforms and 100 ms of compute on 2 cores: the step waits for them.
    assert few_cores.new_step_s == pytest.approx((64 * 0.003 + 0.1) / 2)
    assert few_cores.limited_by == "cores"
    assert "Load in parallel" in parallel_fix(a, has_loader=True)


def test_a_loop_that_loads_in_series_frees_its_own_core_for_workers() -> None:
    # 32 samples of 0.6 ms of transform built by the training thread, 1 ms of compute:
    # the thread is busy loading 95 % of the step. Workers take the loading off it, so
    # both cores of a 2-core machine load: the step halves, it does not stay put.
    p = profile(step_s=0.0202, wait_s=0.0192, fetch_s=0.0006, latency_share=0.0,
                useful_cores=1.0)  # fmt: skip
    a = advise(p, max_processes=2)
    own = 1.0 * 0.0202 - 32 * 0.0006
    assert p.compute_cpu_s == pytest.approx(own)
    assert a.new_step_s == pytest.approx((32 * 0.0006 + own) / 2)
    assert a.speedup == pytest.approx(0.0202 / a.new_step_s)
    assert 1.9 < a.speedup < 2.1 and a.limited_by == "cores"
    # Helper threads that compute alongside: their CPU is the step's too, but only
    # while it computes (1 ms here, on at most both cores).
    busy = advise(p.__class__(**{**p.__dict__, "useful_cores": 1.03}), max_processes=2)
    assert busy.new_step_s == pytest.approx((1.03 * 0.0202) / 2)
    spinning = advise(p.__class__(**{**p.__dict__, "useful_cores": 1.5}), max_processes=2)
    assert spinning.new_step_s == pytest.approx((32 * 0.0006 + 2 * 0.001) / 2)
    # What a measurement cannot make: negative own CPU, or more than the cores hold.
    assert p.__class__(**{**p.__dict__, "useful_cores": 0.2}).compute_cpu_s == 0.0
    capped = p.__class__(**{**p.__dict__, "useful_cores": 30.0}).compute_cpu_s
    assert capped == pytest.approx(2.0 * p.compute_s)


def test_a_loop_without_a_dataloader_is_told_to_build_one() -> None:
    a = advise(profile(latency_share=0.0, fetch_s=0.001, cores=4.0), max_processes=4)
    fix = parallel_fix(a, has_loader=False)
    assert "torch.utils.data.Dataset" in fix and "DataLoader(dataset" in fix


def test_fetch_time_with_and_without_workers() -> None:
    assert fetch_time_s(
        workers=0, samples_per_step=32, step_s=0.5, wait_s=0.32, worker_activity=Counter()
    ) == pytest.approx(0.01)
    # 4 workers busy 75 % of the time deliver 64 samples per 0.5 s step: 23 ms each.
    busy = Counter(file_read=60, transform=15, idle=25)
    assert fetch_time_s(
        workers=4, samples_per_step=64, step_s=0.5, wait_s=0.3, worker_activity=busy
    ) == pytest.approx(0.75 * 4 / 128)
    assert fetch_time_s(workers=4, samples_per_step=64, step_s=0.5, wait_s=0.3,
                        worker_activity=Counter()) is None  # fmt: skip
    assert latency_share(busy) == pytest.approx(0.8)
