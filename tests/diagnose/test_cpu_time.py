"""The job's CPU by role and its threads' waits for a CPU, from host readings."""

from __future__ import annotations

import pytest

from support.builders import T0, make_host, make_host_series
from trainmedic.diagnose.cpu_time import contended_intervals, measure


def test_no_thread_readings_means_unmeasured() -> None:
    cpu = measure(make_host_series(5))
    assert cpu.readings == 0 and cpu.train_wait_share is None
    assert cpu.useful_cores(1.5, 0.5, 2.0) == 1.5  # the job's CPU as measured


def test_means_are_weighted_by_the_period_each_reading_covers() -> None:
    host = [
        make_host(T0 + 1, train_threads=1, train_cpu_cores=0.5, train_wait_cores=0.5,
                  train_wait_max_share=0.5, helper_cpu_cores=0.0, job_threads=4,
                  job_wait_cores=0.5),
        make_host(T0 + 4, train_threads=1, train_cpu_cores=1.0, train_wait_cores=0.0,
                  train_wait_max_share=0.0, helper_cpu_cores=0.0, job_threads=4,
                  job_wait_cores=0.0),
    ]  # fmt: skip
    cpu = measure(host)
    # the first covers 3 s (the median gap), the second 3 s: equal weights
    assert cpu.train_wait_share == pytest.approx(0.25)
    assert cpu.train_cpu_cores == pytest.approx(0.75)


def test_spinning_helpers_do_not_count_beyond_the_compute() -> None:
    # A loop that builds batches in Python 95 % of the time: its OpenMP helper spins
    # 0.7 cores, but can do useful work only in the 5 % the thread computes.
    host = make_host_series(
        6, job_cpu_pct=170.0, usable_cores=2.0, train_threads=1, train_cpu_cores=1.0,
        train_wait_cores=0.0, train_wait_max_share=0.0, helper_cpu_cores=0.7, job_threads=3,
        job_wait_cores=0.0,
    )  # fmt: skip
    cpu = measure(host)
    assert cpu.useful_cores(1.7, 0.05, 2.0) == pytest.approx(1.05)
    assert cpu.useful_cores(1.7, 1.0, 2.0) == pytest.approx(1.7)  # compute-bound: all useful


def test_throttled_share_from_the_cumulative_counter_and_runnable_threads() -> None:
    host = make_host_series(5, cgroup_throttled_s=0.0, job_threads=3, job_wait_cores=1.0,
                            job_cpu_pct=150.0)  # fmt: skip
    host = [
        h.__class__(**{**h.__dict__, "cgroup_throttled_s": 0.25 * i}) for i, h in enumerate(host)
    ]
    cpu = measure(host)
    assert cpu.throttled_share == pytest.approx(0.25)
    assert cpu.job_runnable_cores == pytest.approx(2.5)


def test_contended_intervals_are_the_periods_a_training_thread_waited() -> None:
    host = make_host_series(4, train_threads=1, train_wait_max_share=0.0)
    host[2] = host[2].__class__(**{**host[2].__dict__, "train_wait_max_share": 0.4})
    assert contended_intervals(host, 0.05) == [(T0 + 2.0, T0 + 3.0)]
