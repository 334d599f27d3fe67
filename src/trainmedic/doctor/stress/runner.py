"""A stress run: which GPUs, in which order, for how long; read the GPUs during the bursts.

Order: the GPUs are read once (error counters, PCIe link, other processes: a GPU another
process uses is refused without ``force``); then every selected GPU at once runs dense
matmuls in each dtype and device-to-device copies (the whole machine hot and drawing
power, as in training); then, on a machine with more than one selected GPU, each GPU
alone runs a short matmul pass in its best dtype (a GPU slow only when all run together
is held back by power or heat; one slow alone too is slow itself); then one GPU at a
time runs its memory test and its host copies (host memory and the PCIe switches are
shared: one at a time measures each link's own); then each ordered pair of GPUs copies
peer to peer. During every burst a :class:`~.sampling.LoadSampler` reads every GPU
through the :class:`~trainmedic.gpu.backend.GpuBackend` at a fixed period (started
before the burst, stopped after it); the error counters are read once more at the end.

The compute is a :class:`~.machine.StressMachine` opened only after the checks pass (a real
one starts CUDA on every GPU). Time comes from the injected ``clock``; nothing sleeps.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

from trainmedic.doctor.stress import datasheet
from trainmedic.doctor.stress.dcgm import DcgmOutcome
from trainmedic.doctor.stress.machine import Direction, StressMachine, Work
from trainmedic.doctor.stress.readings import summarize_load
from trainmedic.doctor.stress.results import GIGA, TERA, GpuStress, PeerStress, Rate, StressResult
from trainmedic.doctor.stress.sampling import SAMPLE_PERIOD_S, SamplerFactory, nvml_sampler
from trainmedic.errors import TrainmedicError, UsageError
from trainmedic.gpu.backend import GpuBackend
from trainmedic.gpu.types import GpuSample

Clock = Callable[[], float]
T = TypeVar("T")

BUDGET_SHARES: Mapping[str, float] = {
    "matmul": 0.50,  # split over the dtypes, all GPUs at once
    "matmul_alone": 0.05,  # per GPU, one at a time, its best dtype (to matmul with one GPU)
    "device_copy": 0.10,  # all GPUs at once
    "memtest": 0.15,  # per GPU, one at a time
    "host_copy": 0.10,  # per GPU, split over h2d/d2h x pinned/pageable
    "peer_copy": 0.10,  # over all ordered pairs, at least MIN_BURST_S each
}
"""Share of ``--seconds`` each part of the run gets."""

MAX_GPU_INDEX = 1023
"""Highest GPU index ``--gpus`` accepts (NVML numbers far fewer)."""

MIN_BURST_S = 0.1
"""Shortest burst asked of a GPU, seconds: below it launch overheads show."""

HOST_COPIES: tuple[tuple[Direction, bool], ...] = (
    ("h2d", True),
    ("h2d", False),
    ("d2h", True),
    ("d2h", False),
)


class NoGpuToStress(TrainmedicError):
    """There is no GPU to stress (no driver, no GPU, or no CUDA build of torch)."""

    exit_code = 3


class GpuBusyError(TrainmedicError):
    """A GPU to stress is used by another process, and ``force`` was not given."""

    exit_code = 4


@dataclass(frozen=True)
class StressPlan:
    """What the user asked for.

    Attributes:
        gpus: NVML indices to stress; ``None`` for all.
        seconds: the budget per GPU, seconds.
        burst_s: the longest burst between two readings of the GPUs, seconds.
        memtest_share: share of each GPU's free memory the memory test covers, 0..1.
        force: stress GPUs other processes use.
    """

    gpus: tuple[int, ...] | None = None
    seconds: float = 60.0
    burst_s: float = 0.5
    memtest_share: float = 0.8
    force: bool = False


def parse_gpu_list(text: str) -> tuple[int, ...]:
    """``"0,2-3"`` -> ``(0, 2, 3)``.

    Raises:
        UsageError: anything but non-negative indices and ranges (one line).
    """
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        if not (low.isascii() and low.isdigit()) or (
            dash and not (high.isascii() and high.isdigit())
        ):
            raise UsageError(f"--gpus {text!r}: expected GPU indices such as 0,2 or 0-3")
        first, last = int(low), int(high) if dash else int(low)
        if last > MAX_GPU_INDEX:
            raise UsageError(f"--gpus {text!r}: no machine has GPU {last}")
        if last < first:
            raise UsageError(f"--gpus {text!r}: the range {part} runs backwards")
        out.extend(i for i in range(first, last + 1) if i not in out)
    return tuple(out)


def select_gpus(backend: GpuBackend, wanted: tuple[int, ...] | None) -> tuple[int, ...]:
    """The GPUs to stress.

    Raises:
        UsageError: ``wanted`` names a GPU the machine does not have.
        NoGpuToStress: the machine has none (and ``wanted`` named none).
    """
    count = backend.device_count()
    if wanted is not None:
        missing = [i for i in wanted if i >= count]
        if missing:
            has = f"GPUs 0-{count - 1}" if count > 1 else ("GPU 0" if count else "no GPU")
            raise UsageError(f"--gpus: no GPU {missing[0]} (this machine has {has})")
        return wanted
    if count == 0:
        why = backend.absent_reason or "the driver reports no GPU"
        raise NoGpuToStress(f"no GPU to stress: {why}")
    return tuple(range(count))


def check_not_busy(samples: Sequence[GpuSample], own_pid: int) -> None:
    """Refuse a GPU another process uses (it would be disturbed, and measured slow).

    Raises:
        GpuBusyError: naming the first GPU and its processes.
    """
    for s in samples:
        others = [p for p in s.known_processes or () if p.pid != own_pid]
        if others:
            who = ", ".join(f"pid {p.pid}" + (f" ({p.name})" if p.name else "") for p in others[:3])
            raise GpuBusyError(
                f"GPU {s.index} is in use by {who}: stressing it would disturb that work and "
                "measure it slow; stop it, choose other GPUs with --gpus, or pass --force"
            )


@dataclass
class _Readings:
    """The readings taken during the bursts, per GPU, and the host-copy ones apart."""

    sampler: SamplerFactory
    indices: tuple[int, ...]
    load: dict[int, list[GpuSample]] = field(default_factory=dict)
    link: dict[int, list[GpuSample]] = field(default_factory=dict)

    def during(
        self,
        burst: Callable[[], T],
        link_of: int | None = None,
        worked: Callable[[T], bool] = lambda _: True,
    ) -> T:
        """Run ``burst`` while every GPU is read; ``link_of``: the GPU whose host copies
        it is (its readings also tell the PCIe link under load). The readings of a burst
        that did no work (``worked`` says, from what it returned) are not kept: they were
        not taken under load."""
        sampler = self.sampler(self.indices)
        sampler.start()
        try:
            out = burst()
        finally:
            taken = sampler.stop()
        if not worked(out):
            return out
        for i, samples in taken.items():
            self.load.setdefault(i, []).extend(samples)
            if i == link_of:
                self.link.setdefault(i, []).extend(samples)
        return out


def _bursts(budget_s: float, burst_s: float) -> list[float]:
    """``budget_s`` cut into bursts of at most ``burst_s`` (at least one of MIN_BURST_S)."""
    budget_s = max(budget_s, MIN_BURST_S)
    n = max(1, round(budget_s / burst_s))
    return [budget_s / n] * n


def _rate(works: Sequence[Work], unit: float) -> Rate | None:
    if not works:
        return None
    return Rate.of(
        [w.rate for w in works], sum(w.amount for w in works), sum(w.seconds for w in works), unit
    )


def run_stress(
    plan: StressPlan,
    backend: GpuBackend,
    open_machine: Callable[[Sequence[GpuSample]], tuple[str, StressMachine]],
    clock: Clock,
    own_pid: int | None = None,
    dcgm: Callable[[], DcgmOutcome] | None = None,
    sampler: SamplerFactory | None = None,
    sample_period_s: float = SAMPLE_PERIOD_S,
) -> StressResult:
    """Run ``plan`` on the GPUs ``backend`` reads, driving them through the machine
    ``open_machine`` returns (with its name) for their first readings, after the checks
    pass; ``sampler`` reads the GPUs during each burst (default: a thread reading
    ``backend`` every ``sample_period_s`` seconds, the period the result states);
    ``dcgm`` runs after the load.

    Raises:
        UsageError, NoGpuToStress, GpuBusyError: before any GPU is touched.
    """
    indices = select_gpus(backend, plan.gpus)
    before = {i: backend.sample(i) for i in indices}
    if not plan.force:
        check_not_busy(list(before.values()), os.getpid() if own_pid is None else own_pid)
    started = clock()
    with contextlib.ExitStack() as stack:
        kind, machine = open_machine(list(before.values()))
        stack.callback(machine.close)
        readings = _Readings(sampler or nvml_sampler(backend, sample_period_s), indices)
        tflops, not_measured = _matmuls(plan, machine, readings, indices)
        alone = _matmuls_alone(plan, machine, readings, indices, tflops)
        memory = _device_copies(plan, machine, readings, indices)
        memtests = {
            i: readings.during(
                partial(
                    machine.memtest, i, plan.memtest_share, plan.seconds * BUDGET_SHARES["memtest"]
                )
            )
            for i in indices
        }
        host = {i: _host_copies(plan, machine, readings, i) for i in indices}
        peers = _peer_copies(plan, machine, readings, indices)
        after = {i: backend.sample(i) for i in indices}
    outcome = dcgm() if dcgm is not None else None
    gpus = tuple(
        GpuStress(
            index=i,
            name=before[i].name,
            uuid=before[i].uuid,
            datasheet=datasheet.lookup(before[i].name),
            tflops=tflops.get(i, {}),
            not_measured=not_measured.get(i, {}),
            memory_gb_per_s=memory.get(i),
            memtest=memtests.get(i),
            host_gb_per_s=host.get(i, {}),
            link=before[i].pcie,
            readings=summarize_load(
                readings.load.get(i, []), readings.link.get(i, []), sample_period_s
            ),
            ecc_before=before[i].ecc,
            ecc_after=after[i].ecc,
            rows_before=before[i].remapped_rows,
            rows_after=after[i].remapped_rows,
            tflops_alone=alone.get(i, {}),
        )
        for i in indices
    )
    return StressResult(
        seconds=plan.seconds,
        elapsed_s=clock() - started,
        backend=backend.kind,
        machine=kind,
        gpus=gpus,
        peers=peers,
        dcgm=outcome,
    )


def _matmuls(
    plan: StressPlan, machine: StressMachine, readings: _Readings, indices: tuple[int, ...]
) -> tuple[dict[int, dict[str, Rate]], dict[int, dict[str, str]]]:
    support = {i: machine.dtypes(i) for i in indices}
    not_measured = {i: {d: why for d, why in support[i].items() if why} for i in indices}
    runnable = [
        d
        for d in datasheet.DTYPES
        if any(support[i].get(d) is None and d in support[i] for i in indices)
    ]
    out: dict[int, dict[str, Rate]] = {i: {} for i in indices}
    if not runnable:
        return out, not_measured
    share = BUDGET_SHARES["matmul"]
    if len(indices) == 1:  # all at once is alone: the alone pass's share goes here
        share += BUDGET_SHARES["matmul_alone"]
    budget = plan.seconds * share / len(runnable)
    for dtype in runnable:
        on = [i for i in indices if dtype in support[i] and support[i][dtype] is None]
        works: dict[int, list[Work]] = {i: [] for i in on}
        for burst in _bursts(budget, plan.burst_s):
            done = readings.during(partial(machine.matmul, on, dtype, burst))
            for i, w in done.items():
                works[i].append(w)
        for i in on:
            rate = _rate(works[i], TERA)
            if rate is not None:
                out[i][dtype] = rate
    return out, not_measured


def best_dtype(measured: Mapping[str, Rate]) -> str | None:
    """The dtype a GPU computes fastest in, of those it ran (the first of
    :data:`~.datasheet.DTYPES`, which are ordered fastest first)."""
    return next((d for d in datasheet.DTYPES if d in measured), None)


def _matmuls_alone(
    plan: StressPlan,
    machine: StressMachine,
    readings: _Readings,
    indices: tuple[int, ...],
    together: Mapping[int, Mapping[str, Rate]],
) -> dict[int, dict[str, Rate]]:
    """Each GPU alone, in its best dtype, for its share of the budget: only where more
    than one GPU ran together (with one, together was alone)."""
    out: dict[int, dict[str, Rate]] = {}
    if len(indices) < 2:
        return out
    for i in indices:
        dtype = best_dtype(together.get(i, {}))
        if dtype is None:
            continue
        works: list[Work] = []
        for burst in _bursts(plan.seconds * BUDGET_SHARES["matmul_alone"], plan.burst_s):
            done = readings.during(partial(machine.matmul, [i], dtype, burst))
            works.extend(w for j, w in done.items() if j == i)
        rate = _rate(works, TERA)
        if rate is not None:
            out[i] = {dtype: rate}
    return out


def _device_copies(
    plan: StressPlan, machine: StressMachine, readings: _Readings, indices: tuple[int, ...]
) -> dict[int, Rate]:
    works: dict[int, list[Work]] = {i: [] for i in indices}
    for burst in _bursts(plan.seconds * BUDGET_SHARES["device_copy"], plan.burst_s):
        done = readings.during(partial(machine.device_copy, indices, burst))
        for i, w in done.items():
            works[i].append(w)
    return {i: r for i in indices if (r := _rate(works[i], GIGA)) is not None}


def _host_copies(
    plan: StressPlan, machine: StressMachine, readings: _Readings, index: int
) -> dict[str, Rate]:
    out: dict[str, Rate] = {}
    budget = plan.seconds * BUDGET_SHARES["host_copy"] / len(HOST_COPIES)
    for direction, pinned in HOST_COPIES:
        works = []
        for burst in _bursts(budget, plan.burst_s):
            works.append(
                readings.during(
                    partial(machine.host_copy, index, direction, pinned, burst), link_of=index
                )
            )
        rate = _rate(works, GIGA)
        if rate is not None:
            out[f"{direction}_{'pinned' if pinned else 'pageable'}"] = rate
    return out


def _peer_copies(
    plan: StressPlan, machine: StressMachine, readings: _Readings, indices: tuple[int, ...]
) -> tuple[PeerStress, ...]:
    pairs = [(a, b) for a in indices for b in indices if a != b]
    if not pairs:
        return ()
    budget = max(MIN_BURST_S, plan.seconds * BUDGET_SHARES["peer_copy"] / len(pairs))
    out = []
    for src, dst in pairs:
        works: list[Work] = []
        for burst in _bursts(budget, plan.burst_s):
            w = readings.during(
                partial(machine.peer_copy, src, dst, burst), worked=lambda w: w is not None
            )
            if w is None:
                break
            works.append(w)
        out.append(PeerStress(src, dst, _rate(works, GIGA)))
    return tuple(out)
