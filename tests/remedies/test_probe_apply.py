"""The applier inside the job: it changes DataLoaders as planned, verifies that workers
start, falls back to the script's own settings when they cannot, and reports all of it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from trainmedic.probe.apply import Applier
from trainmedic.record.types import RunEvent

from .apply_targets import Numbers, OtherNumbers, Stream, VaryingShapes, die_at_start


class FakeProbe:
    """What the applier uses of the probe: events, restore hooks, the training thread."""

    def __init__(self) -> None:
        self.role = "process"
        self.events: list[RunEvent] = []
        self.restore: list[Any] = []
        self.state = SimpleNamespace(training_ident=threading.get_ident())

    def event(self, kind: str, message: str, data: dict[str, Any]) -> RunEvent:
        return RunEvent(t=0.0, kind=kind, message=message, data=data)

    def emit(self, event: RunEvent) -> None:
        self.events.append(event)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]


@pytest.fixture
def apply() -> Iterator[Any]:
    probes: list[FakeProbe] = []

    def install(**plan: Any) -> tuple[Applier, FakeProbe]:
        probe = FakeProbe()
        probes.append(probe)
        applier = Applier(torch, probe, {"source": "prev-run", **plan})  # type: ignore[arg-type]
        applier.install()
        return applier, probe

    yield install
    for probe in probes:
        while probe.restore:
            probe.restore.pop()()


def test_a_planned_loader_gets_more_workers_and_keeps_them_when_they_start(apply: Any) -> None:
    _, probe = apply(dataloader={"num_workers": 2, "prefetch_factor": 4}, dataset_types=[])
    loader = DataLoader(Numbers(), batch_size=8)
    assert (loader.num_workers, loader.prefetch_factor) == (2, 4)
    assert sum(len(b) for b in loader) == 64  # the preflight passed: the epoch is whole
    assert loader.num_workers == 2
    (event,) = probe.events
    assert event.kind == "remedy_applied"
    assert event.data["changed"] == {"num_workers": [0, 2], "prefetch_factor": [None, 4]}
    assert event.data["source"] == "prev-run"
    assert (
        event.message == "DataLoader num_workers 0 -> 2, prefetch_factor None -> 4 (--apply-from)"
    )


def test_planned_fetch_threads_wrap_the_dataset_and_keep_its_batches(apply: Any) -> None:
    from trainmedic.remedies.threaded import ThreadedFetch

    _, probe = apply(dataloader={"num_workers": 1, "threads": 4}, dataset_types=[])
    loader = DataLoader(Numbers(), batch_size=8)
    assert isinstance(loader.dataset, ThreadedFetch) and loader.dataset.threads == 4
    batches = [b[:, 0].tolist() for b in loader]
    assert batches == [[float(i) for i in range(k, k + 8)] for k in range(0, 64, 8)]  # in order
    (event,) = probe.events
    assert event.data["changed"] == {
        "num_workers": [0, 1],
        "dataset": [f"{Numbers.__module__}.Numbers", "ThreadedFetch(threads=4)"],
    }


def test_the_scripts_own_larger_settings_are_never_lowered(apply: Any) -> None:
    _, probe = apply(dataloader={"num_workers": 2, "prefetch_factor": 4})
    loader = DataLoader(Numbers(), batch_size=8, num_workers=3, prefetch_factor=6)
    assert (loader.num_workers, loader.prefetch_factor) == (3, 6)
    assert probe.events == []


def test_loaders_over_other_datasets_are_left_alone(apply: Any) -> None:
    types = [f"{Numbers.__module__}.Numbers"]
    _, probe = apply(dataloader={"num_workers": 2}, dataset_types=types)
    assert DataLoader(OtherNumbers(), batch_size=8).num_workers == 0
    assert DataLoader(Numbers(), batch_size=8).num_workers == 2
    assert probe.kinds() == ["remedy_applied"]


def test_a_dataset_of_the_same_name_from_other_code_is_left_alone(apply: Any) -> None:
    from trainmedic.codehash import code_of

    types = [f"{Numbers.__module__}.Numbers"]
    _, probe = apply(dataloader={"num_workers": 2}, dataset_types=types,
                     dataset_codes=["0" * 64])  # tuned on another file's Numbers  # fmt: skip
    assert DataLoader(Numbers(), batch_size=8).num_workers == 0
    assert probe.kinds() == ["remedy_not_applied"]
    assert "defined by other code than the dataset tuned" in probe.events[0].data["reason"]
    code = code_of(Numbers())
    assert code is not None and len(code) == 64
    _, same = apply(dataloader={"num_workers": 2}, dataset_types=types, dataset_codes=[code])
    assert DataLoader(Numbers(), batch_size=8).num_workers == 2
    assert same.kinds() == ["remedy_applied"]


def test_an_iterable_dataset_is_not_given_workers_and_the_record_says_why(apply: Any) -> None:
    _, probe = apply(dataloader={"num_workers": 2})
    assert DataLoader(Stream(), batch_size=2).num_workers == 0
    assert probe.kinds() == ["remedy_not_applied"]
    assert "shards itself" in probe.events[0].data["reason"]


def test_an_unpicklable_dataset_under_spawn_falls_back_to_the_scripts_settings(
    apply: Any,
) -> None:
    _, probe = apply(dataloader={"num_workers": 2, "prefetch_factor": 4})
    ds = Numbers(transform=lambda x: x + 1)  # a lambda: spawned workers cannot unpickle it
    loader = DataLoader(ds, batch_size=8, multiprocessing_context="spawn")
    assert loader.num_workers == 2
    batches = list(loader)  # the script's own loop still runs, in this process
    assert loader.num_workers == 0 and loader.prefetch_factor is None
    assert torch.equal(torch.cat(batches)[:, 0], torch.arange(64.0) + 1)
    assert probe.kinds() == ["remedy_applied", "remedy_reverted"]
    reverted = probe.events[1]
    assert "pickle" in reverted.data["reason"].lower()
    assert reverted.data["restored"] == {"num_workers": 0, "prefetch_factor": None}


def test_workers_that_die_at_start_fall_back_to_the_scripts_settings(apply: Any) -> None:
    _, probe = apply(dataloader={"num_workers": 2})
    loader = DataLoader(Numbers(), batch_size=8, worker_init_fn=die_at_start)
    # the script's own setting (no workers) never calls worker_init_fn
    assert sum(len(b) for b in loader) == 64
    assert loader.num_workers == 0
    assert probe.kinds() == ["remedy_applied", "remedy_reverted"]
    assert "exited unexpectedly" in probe.events[1].data["reason"]


def test_the_preflight_leaves_the_scripts_random_stream_as_it_was(apply: Any) -> None:
    def draw(**plan: Any) -> torch.Tensor:
        torch.manual_seed(7)
        loader = DataLoader(Numbers(), batch_size=8, shuffle=True, num_workers=2 if not plan else 0)
        order = torch.cat(list(loader))[:, 0]
        return torch.cat([order, torch.rand(3)])

    plain = draw()
    apply(dataloader={"num_workers": 2})
    assert torch.equal(draw(applied=True), plain)


def test_switches_on_a_cpu_build_are_not_applied_and_say_why(apply: Any) -> None:
    applier, probe = apply(switches={"tf32_matmul": True, "cudnn_benchmark": True})
    assert probe.events == []  # reported once the process is seen to train, or at exit
    applier.report_switches()
    assert probe.kinds() == ["remedy_not_applied", "remedy_not_applied"]
    assert all("CPU build" in e.message for e in probe.events)
    assert torch.get_float32_matmul_precision() == "highest"


@pytest.fixture
def cuda_build(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """torch as a CUDA build would report itself; the switches are restored afterwards."""
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    precision = torch.get_float32_matmul_precision()
    benchmark = torch.backends.cudnn.benchmark
    yield
    torch.set_float32_matmul_precision(precision)
    torch.backends.cudnn.benchmark = benchmark


@pytest.mark.usefixtures("cuda_build")
def test_tf32_at_once_and_cudnn_autotuning_after_batches_of_fixed_shape(apply: Any) -> None:
    _, probe = apply(switches={"tf32_matmul": True, "cudnn_benchmark": True})
    assert torch.get_float32_matmul_precision() == "high"
    loader = DataLoader(Numbers(n=24 * 4, shape=(3, 8)), batch_size=4)
    for i, _ in enumerate(loader):
        assert torch.backends.cudnn.benchmark is (i >= 19)
        assert probe.kinds() == ["remedy_applied"] * (1 if i < 19 else 2)
    assert probe.events[1].data["changed"] == {"cudnn.benchmark": [False, True]}


@pytest.mark.usefixtures("cuda_build")
def test_cudnn_autotuning_stays_off_when_input_shapes_vary(apply: Any) -> None:
    _, probe = apply(switches={"cudnn_benchmark": True})
    for _ in DataLoader(VaryingShapes(), batch_size=4):
        pass
    assert torch.backends.cudnn.benchmark is False
    assert probe.kinds() == ["remedy_not_applied"]
    assert "shapes vary" in probe.events[0].message


def test_a_malformed_plan_is_reported_and_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trainmedic.probe import apply as apply_module

    probe = FakeProbe()
    monkeypatch.setenv("TRAINMEDIC_APPLY", "{not json")
    assert apply_module.install(torch, probe) is None  # type: ignore[arg-type]
    assert probe.kinds() == ["probe_error"] and probe.restore == []
    assert DataLoader(Numbers(), batch_size=8).num_workers == 0
