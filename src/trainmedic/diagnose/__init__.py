"""Diagnosis of a run: pure rules from a run record (and doctor's facts) to ranked findings.

Each rule is a pure function ``(RunView, Thresholds) -> list[Finding]`` in the
module of its family; :data:`RULES` lists them in the order they run and
:func:`diagnose_run` applies them, checks that every finding's parts agree
(:mod:`trainmedic.diagnose.consistency`), adds the overall verdict
(``run.healthy`` / ``run.no_steps``) and ranks the result. The findings of the
run's profiler windows, when it has some (:mod:`trainmedic.diagnose.trace_windows`),
join the run's before the verdict. Thresholds and
their reasons: docs/diagnosis.md.

:func:`diagnose` is the public entry: a run directory in, ranked findings out.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from trainmedic.diagnose.amp import grad_scaler_skips
from trainmedic.diagnose.consistency import InconsistentFinding, checked
from trainmedic.diagnose.contention import cpu_contention, gpu_contention
from trainmedic.diagnose.gpu_visibility import gpu_visibility
from trainmedic.diagnose.hardware import hardware_faults
from trainmedic.diagnose.healthy import overall
from trainmedic.diagnose.host_time import host_time
from trainmedic.diagnose.incidents import incidents
from trainmedic.diagnose.input_bound import input_bound
from trainmedic.diagnose.memory import memory_pressure
from trainmedic.diagnose.precision import no_mixed_precision
from trainmedic.diagnose.probe_coverage import probe_coverage
from trainmedic.diagnose.probe_reach import probe_reach
from trainmedic.diagnose.ranks import distributed
from trainmedic.diagnose.shm import shm_too_small
from trainmedic.diagnose.stalls import stalls
from trainmedic.diagnose.tf_gpu import tf_memory_pool
from trainmedic.diagnose.thermal import throttling
from trainmedic.diagnose.thresholds import DEFAULT_THRESHOLDS, Thresholds
from trainmedic.diagnose.trace_windows import PRECISE_GPU, window_findings
from trainmedic.diagnose.utilization import host_overhead, small_batch
from trainmedic.diagnose.view import RunView
from trainmedic.doctor.facts import MachineFacts
from trainmedic.findings.model import Finding, rank_findings
from trainmedic.record.types import RunRecord
from trainmedic.traces.windows import WindowTrace

Rule = Callable[[RunView, Thresholds], Sequence[Finding]]

RULES: tuple[Rule, ...] = (
    input_bound,
    host_time,
    shm_too_small,
    host_overhead,
    small_batch,
    no_mixed_precision,
    grad_scaler_skips,
    memory_pressure,
    tf_memory_pool,
    gpu_contention,
    cpu_contention,
    throttling,
    hardware_faults,
    gpu_visibility,
    stalls,
    incidents,
    probe_reach,
    probe_coverage,
    distributed,
)


def diagnose_run(
    record: RunRecord,
    machine: MachineFacts | None = None,
    thresholds: Thresholds = DEFAULT_THRESHOLDS,
    rules: Sequence[Rule] = RULES,
    *,
    strict: bool = False,
    windows: Sequence[WindowTrace] = (),
) -> list[Finding]:
    """Findings about ``record``, most important first (:func:`rank_findings`), with
    those of its profiler windows' traces (:func:`~trainmedic.traces.windows.read_window_traces`).

    Every finding passes the consistency checks (:mod:`trainmedic.diagnose.consistency`)
    before the overall verdict is drawn: one whose parts disagree is kept as
    information with its problems, or, with ``strict``, raises
    :class:`~trainmedic.diagnose.consistency.InconsistentFinding`.
    """
    view = RunView.of(record, machine)
    findings: list[Finding] = []
    for rule in rules:
        findings.extend(rule(view, thresholds))
    findings = checked(findings, view, thresholds, strict=strict)
    findings.extend(window_findings(windows))
    findings = _without_superseded(findings)
    findings.extend(checked(overall(view, thresholds, findings), view, thresholds, strict=strict))
    return rank_findings(findings)


def diagnose(run_dir: str | os.PathLike[str]) -> list[Finding]:
    """A fresh diagnosis of the run in ``run_dir`` (what ``trainmedic run`` wrote), most
    important first: its record and its profiler windows' traces, with today's rules
    (its ``findings.json`` is not read). The same findings ``trainmedic report`` gives
    for a run directory without a ``findings.json``.

    Raises:
        RunDirectoryError: the directory is missing, unreadable or not a run's.
    """
    from trainmedic.record.reader import load_run_record

    directory = Path(run_dir)
    return diagnose_stored(load_run_record(directory), directory)


def diagnose_stored(record: RunRecord, run_dir: Path) -> list[Finding]:
    """:func:`diagnose_run` of a record read from ``run_dir``, with the traces of the
    profiler windows the run wrote there."""
    from trainmedic.traces.windows import read_window_traces

    return diagnose_run(record, windows=read_window_traces(run_dir).traces)


STRAGGLER_DATA = "distributed.straggler.data"
HOST_OVERHEAD = "gpu.host_overhead"


def _without_superseded(findings: list[Finding]) -> list[Finding]:
    """Drop pooled findings that a precise one explains.

    In a distributed run whose data wait is one rank's (a data straggler), the
    input rule, which pools every rank's steps, would report the job waiting for
    data at the average of one slow rank and fast ones, naming no rank; the
    straggler finding names the rank, its cause and what it costs the others.

    A profiler window that names why the GPU idles (a synchronisation, launches,
    pageable copies, the allocator) replaces the run's finding that it idles while
    the host works, which could say no more than that.
    """
    if any(f.id == STRAGGLER_DATA for f in findings):
        findings = [f for f in findings if not f.id.startswith("input.")]
    if any(f.id in PRECISE_GPU for f in findings):
        findings = [f for f in findings if f.id != HOST_OVERHEAD]
    return findings


__all__ = [
    "DEFAULT_THRESHOLDS",
    "RULES",
    "InconsistentFinding",
    "Rule",
    "RunView",
    "Thresholds",
    "diagnose",
    "diagnose_run",
    "diagnose_stored",
]
