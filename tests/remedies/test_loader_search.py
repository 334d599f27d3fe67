"""The tuner's search over a model of a machine: it walks the axis that matters within budget."""

from __future__ import annotations

from dataclasses import replace

import pytest

from trainmedic.remedies.limits import LoaderLimits
from trainmedic.remedies.loader_measure import DatasetProfile, LoaderSettings, Trial
from trainmedic.remedies.loader_search import Search, summarize


class Machine:
    """Throughput of a loader on ``cores`` cores: CPU work of ``cpu_s`` and waiting of
    ``wait_s`` per sample; one worker only matches the main process (IPC)."""

    def __init__(self, cores: int, cpu_s: float, wait_s: float, fail: set[int] | None = None):
        self.cores = cores
        self.cpu_s = cpu_s
        self.wait_s = wait_s
        self.now = 0.0
        self.fail = fail or set()
        self.measured: list[LoaderSettings] = []

    def clock(self) -> float:
        return self.now

    def rate(self, s: LoaderSettings) -> float:
        in_flight = s.in_flight
        procs = max(1, s.num_workers)
        cpu_bound = min(procs, self.cores) / self.cpu_s if self.cpu_s else float("inf")
        latency_bound = in_flight / (self.cpu_s + self.wait_s)
        rate = min(cpu_bound, latency_bound)
        if s.num_workers == 1:
            rate *= 0.95  # IPC: a single worker is no faster than the main process
        return rate * (1.1 if s.prefetch_factor == 4 and s.num_workers else 1.0)

    def measure(
        self,
        settings: LoaderSettings,
        window_s: float,
        segments: int,
        deadline: float | None = None,
        phase: str = "",
    ) -> Trial:
        self.measured.append(settings)
        self.now += 0.2 + window_s * (segments + 1)
        if settings.num_workers in self.fail:
            return Trial(settings, error="RuntimeError: DataLoader worker exited unexpectedly")
        r = self.rate(settings)
        return Trial(settings, (r * 0.99, r, r * 1.01), startup_s=0.2, phase=phase)


def profile(cpu_s: float, wait_s: float) -> DatasetProfile:
    wall = cpu_s + wait_s
    return DatasetProfile(sample_s=wall, cpu_share=cpu_s / wall, batch_bytes=1 << 20, samples=16)


def search(machine: Machine, budget_s: float = 60.0, **kw: object) -> Search:
    args = {
        "iterable": False,
        "cuda": False,
        "budget_s": budget_s,
        "batch_size": 32,
        "clock": machine.clock,
    }
    args.update(kw)
    return Search(
        machine.measure,
        profile(machine.cpu_s, machine.wait_s),
        LoaderLimits(
            usable_cores=machine.cores, memory_available_bytes=1 << 34, shm_free_bytes=1 << 30
        ),
        LoaderSettings(),
        **args,  # type: ignore[arg-type]
    )


def test_cpu_bound_data_gets_one_worker_per_usable_core_past_a_single_worker_that_did_not_pay() -> (
    None
):
    machine = Machine(cores=2, cpu_s=0.002, wait_s=0.0)
    s = search(machine)
    baseline, best, recommended = s.run()
    assert best.settings.num_workers == 2 and best.settings.threads == 1
    assert recommended.persistent_workers
    assert max(x.num_workers for x in machine.measured) == 2  # never past the cores
    result = summarize(s, baseline, best, recommended, 10.0)
    assert result.speedup == pytest.approx(2 * 1.1, rel=0.02)  # and prefetch 4 paid a little
    assert result.significant


def test_latency_bound_data_gets_samples_in_flight_by_threads_beyond_the_cores() -> None:
    machine = Machine(cores=2, cpu_s=0.0001, wait_s=0.02)
    s = search(machine)
    baseline, best, recommended = s.run()
    assert best.settings.in_flight >= 64
    assert best.settings.threads > 1
    assert summarize(s, baseline, best, recommended, 0.0).speedup > 30


def test_iterable_latency_bound_data_gets_worker_processes_beyond_the_cores() -> None:
    machine = Machine(cores=2, cpu_s=0.0001, wait_s=0.02)
    s = search(machine, iterable=True)
    _, best, _ = s.run()
    assert best.settings.threads == 1 and best.settings.num_workers > 2


@pytest.mark.parametrize(("wait_s", "trials"), [(0.002, 6), (0.02, 2)])
def test_the_search_stays_within_its_budget(wait_s: float, trials: int) -> None:
    machine = Machine(cores=2, cpu_s=0.0001, wait_s=wait_s)
    s = search(machine, budget_s=10.0)
    s.run()
    assert machine.now <= 10.0 + 1e-9
    # a batch of 32 at 20 ms per sample takes 0.64 s: ten seconds hold fewer trials
    assert len(machine.measured) >= trials


def test_settings_whose_workers_cannot_start_are_never_best() -> None:
    machine = Machine(cores=4, cpu_s=0.002, wait_s=0.0, fail={2, 4, 3})
    s = search(machine)
    baseline, best, recommended = s.run()
    result = summarize(s, baseline, best, recommended, 0.0)
    assert best.settings.num_workers in (0, 1)
    failed = [t for t in result.to_dict()["trials"] if t["error"]]
    assert failed and all("exited unexpectedly" in t["error"] for t in failed)
    assert all(t["settings"]["num_workers"] in (2, 3, 4) for t in failed)


def test_nothing_better_means_the_current_settings_with_a_speedup_of_one() -> None:
    machine = Machine(cores=1, cpu_s=0.002, wait_s=0.0)
    s = search(machine)
    baseline, best, recommended = s.run()
    result = summarize(s, baseline, best, recommended, 0.0)
    assert result.best.settings == result.baseline.settings
    assert result.speedup == 1.0 and result.speedup_ci == (1.0, 1.0)
    assert not result.significant
    assert result.to_dict()["best"]["num_workers"] == 0


def test_the_code_to_paste_names_every_setting() -> None:
    machine = Machine(cores=2, cpu_s=0.0001, wait_s=0.02)
    s = search(machine)
    result = summarize(s, *s.run(), 0.0)
    code = result.code("train_set")
    assert code.startswith("DataLoader(trainmedic.remedies.ThreadedFetch(train_set, threads=")
    assert "persistent_workers=True" in code and "batch_size=32" in code


def test_a_shm_too_small_for_the_batches_caps_the_workers() -> None:
    machine = Machine(cores=8, cpu_s=0.002, wait_s=0.0)
    s = search(machine)
    s.limits = replace(s.limits, shm_free_bytes=6 << 20)  # 1 MiB batches x prefetch 2, half of it
    _, best, _ = s.run()
    assert best.settings.num_workers <= 1
    assert any("/dev/shm" in n for n in s.notes)


def test_workers_stop_where_memory_would_run_out() -> None:
    class Heavy(Machine):
        def measure(self, settings: LoaderSettings, *args: object, **kw: object) -> Trial:
            trial = super().measure(settings, *args, **kw)  # type: ignore[arg-type]
            return replace(trial, worker_rss_bytes=3 << 30)  # 3 GiB per worker

    machine = Heavy(cores=16, cpu_s=0.002, wait_s=0.0)
    s = search(machine)
    s.limits = replace(s.limits, memory_available_bytes=16 << 30)  # half of it: 2 workers
    _, best, _ = s.run()
    assert max(x.num_workers for x in machine.measured) <= 2
    assert best.settings.num_workers == 2
    assert any("memory holds at most 2 workers" in n for n in s.notes)
