"""What ``trainmedic run --apply-from SOURCE`` applies, decided before the job starts.

``SOURCE`` is a previous run directory — its findings' ``apply`` payloads
(:attr:`trainmedic.findings.model.Finding.apply`; warnings and errors only)
and its record's evidence for the torch switches
(:mod:`trainmedic.remedies.apply.switches`) — or the JSON file of
``trainmedic tune dataloader --json FILE``, whose best settings are applied
only when their speed-up was significant (its 95 % interval above 1x).

The plan travels to the job in :data:`APPLY_ENV` (JSON); the probe in each
process applies it (:mod:`trainmedic.probe.apply`) and reports every change
in the run record. This module runs in the supervisor: no torch.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainmedic.errors import InputError
from trainmedic.findings.model import Finding, Severity
from trainmedic.jsonfile import describe, read_json
from trainmedic.record.events import EventKind
from trainmedic.record.types import RunRecord
from trainmedic.remedies.apply.switches import RunEvidence, plan_switches
from trainmedic.remedies.limits import MAX_IN_FLIGHT, LoaderLimits

APPLY_ENV = "TRAINMEDIC_APPLY"
"""The plan, as JSON, in the job's environment."""

LOADER_KEYS = ("num_workers", "prefetch_factor", "pin_memory", "threads", "persistent_workers")

VALID_RANGE: Mapping[str, tuple[int, int]] = {
    "num_workers": (0, 65536),
    "prefetch_factor": (1, 65536),
    "threads": (1, 65536),
}
"""What a loader setting may be at all (a value outside is an error in the source, exit 2)."""
MAX_PREFETCH = 16
"""Batches a worker prepares ahead at most: more only holds memory and ``/dev/shm``."""
FDS_PER_WORKER = 16
"""Open files a DataLoader worker costs its process, about (pipes, queues, shared memory)."""

@dataclass(frozen=True)
class ApplyPlan:
    """The changes to make inside the job, and why.

    Attributes:
        source: the run directory or tuning file it came from.
        dataloader: settings for the DataLoaders (:data:`LOADER_KEYS`).
        switches: torch switches to turn on (``tf32_matmul``, ``cudnn_benchmark``).
        dataset_types: only loaders over these dataset classes are changed
            (empty: any map-style dataset).
        reasons: why each setting or switch is (or is not) in the plan.
        made_for: the command line of the run the plan was measured on; empty for a
            tuning file.
        dataset_codes: hashes of the files defining the dataset classes measured
            (:mod:`trainmedic.codehash`; a tuning file's): only loaders over a class of
            the same name *and* code are changed (empty: the name decides).
    """

    source: str
    dataloader: Mapping[str, Any] = field(default_factory=dict)
    switches: Mapping[str, bool] = field(default_factory=dict)
    dataset_types: tuple[str, ...] = ()
    reasons: Mapping[str, str] = field(default_factory=dict)
    made_for: tuple[str, ...] = ()
    dataset_codes: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.dataloader and not self.switches

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "dataloader": dict(self.dataloader),
            "switches": dict(self.switches),
            "dataset_types": list(self.dataset_types),
            "reasons": dict(self.reasons),
            "made_for": list(self.made_for),
            "dataset_codes": list(self.dataset_codes),
        }

    def to_env(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ApplyPlan:
        return cls(
            source=str(data.get("source", "")),
            dataloader=dict(data.get("dataloader") or {}),
            switches={str(k): bool(v) for k, v in dict(data.get("switches") or {}).items()},
            dataset_types=tuple(str(t) for t in data.get("dataset_types") or ()),
            reasons={str(k): str(v) for k, v in dict(data.get("reasons") or {}).items()},
            made_for=tuple(str(a) for a in data.get("made_for") or ()),
            dataset_codes=tuple(str(c) for c in data.get("dataset_codes") or ()),
        )

    def describe(self) -> list[str]:
        """One line per planned change, then what was left out and why."""
        lines = []
        for key, value in self.dataloader.items():
            why = self.reasons.get(key, "")
            lines.append(f"DataLoader {key}={value}" + (f" ({why})" if why else ""))
        for name in self.switches:
            lines.append(f"{name} ({self.reasons.get(name, '')})")
        for key, why in self.reasons.items():
            if key not in self.dataloader and key not in self.switches:
                lines.append(f"{key}: {why}")
        return lines


def plan_from(source: str | Path, limits: LoaderLimits | None = None) -> ApplyPlan:
    """The plan for ``source``: a run directory or a tuning JSON file, its values checked
    and held to this machine's ``limits`` (read now when not given)."""
    path = Path(source)
    if path.is_dir() or path.is_file():
        plan = plan_from_run(path) if path.is_dir() else plan_from_tuning(path)
        if not plan.dataloader:
            return plan
        if limits is None:
            from trainmedic.remedies.limits import read_limits

            limits = read_limits()
        return bound_to_machine(plan, limits, _open_files_limit())
    if path.exists():  # a device, a FIFO, a socket: nothing a tuning run writes
        raise InputError(f"--apply-from {source}: not a run directory or a regular file")
    raise InputError(f"--apply-from {source}: no such run directory or tuning file")


def _valid(key: str, value: Any, source: str) -> Any:
    """``value`` of loader setting ``key`` checked for type and range: a whole number in
    :data:`VALID_RANGE`, or a boolean for ``pin_memory``/``persistent_workers``.

    Raises:
        InputError: one line naming the source, the setting and what it should be.
    """
    if key in ("pin_memory", "persistent_workers"):
        if not isinstance(value, bool):
            raise InputError(
                f"--apply-from {source}: {key} must be true or false, not {_shown(value)}"
            )
        return value
    low, high = VALID_RANGE[key]
    whole = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(value, float) and value.is_integer() and abs(value) <= high:
        value, whole = int(value), True
    if not whole or not low <= value <= high:
        raise InputError(
            f"--apply-from {source}: {key} must be a whole number from {low} to {high}, "
            f"not {_shown(value)}"
        )
    return value


def _shown(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool)) else type(value).__name__
    return text if len(text) <= 40 else text[:37] + "..."


def bound_to_machine(plan: ApplyPlan, limits: LoaderLimits, nofile: int | None) -> ApplyPlan:
    """``plan`` with its loader settings held to what this machine can run: a worker per
    usable core, the open files its processes may have, :data:`MAX_PREFETCH` batches
    ahead, the samples in flight of :data:`~trainmedic.remedies.limits.MAX_IN_FLIGHT`.
    Each value lowered says so in the plan's reasons ("24 asked, 2 applied: ...")."""
    loader = dict(plan.dataloader)
    reasons = dict(plan.reasons)

    def lower(key: str, cap: int, why: str) -> None:
        asked = loader.get(key)
        if isinstance(asked, int) and not isinstance(asked, bool) and asked > cap:
            loader[key] = cap
            reasons[key] = f"{asked} asked, {cap} applied: {why}; {reasons.get(key, '')}".rstrip(
                "; "
            )

    cores = limits.cpu_workers
    lower("num_workers", cores, f"{limits.usable_cores:g} usable cores on this machine")
    if nofile is not None:
        lower(
            "num_workers",
            max(1, nofile // (2 * FDS_PER_WORKER)),
            f"the job may open {nofile} files (ulimit -n), about {FDS_PER_WORKER} a worker",
        )
    lower("prefetch_factor", MAX_PREFETCH, "more batches ahead only hold memory")
    workers = max(1, int(loader.get("num_workers") or 1))
    lower("threads", max(1, MAX_IN_FLIGHT // workers),
          f"{MAX_IN_FLIGHT} samples in flight at most")  # fmt: skip
    return dataclasses.replace(plan, dataloader=loader, reasons=reasons)


def _merge_loader(
    into: dict[str, Any],
    reasons: dict[str, str],
    settings: Mapping[str, Any],
    why: str,
    source: str = "",
) -> None:
    for key, value in settings.items():
        if key not in LOADER_KEYS or value is None:
            continue
        value = _valid(key, value, source)
        if key == "persistent_workers":
            reasons[key] = (
                "not applied: persistent workers keep their copy of the dataset, which "
                "changes scripts that modify it between epochs"
            )
            continue
        if value is False or (key != "threads" and value == 0) or (key == "threads" and value == 1):
            continue  # a remedy only turns on and raises; the script's own values stay
        old = into.get(key)
        if isinstance(value, bool):
            new: Any = bool(old) or value
        else:
            new = max(int(value), int(old or 0))
        if new != old:
            into[key] = new
            reasons[key] = why


def _open_files_limit() -> int | None:
    """The soft limit of open files the job inherits (``ulimit -n``), when one is set."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return None
    return None if soft == resource.RLIM_INFINITY else int(soft)


def _findings(run_dir: Path, record: RunRecord) -> tuple[list[Finding], dict[str, Any]]:
    """The run's findings as reported (``findings.json``) and that document's context;
    a fresh diagnosis of the record when the run wrote none."""
    from trainmedic.record.layout import FINDINGS_FILE

    path = run_dir / FINDINGS_FILE
    if path.exists():
        from trainmedic.findings.model import FindingsDocument

        try:
            data = read_json(path)
        except (OSError, ValueError) as exc:
            raise InputError(f"--apply-from {path}: unreadable findings: {describe(exc)}") from None
        try:
            doc = FindingsDocument.from_dict(data)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InputError(
                f"--apply-from {path}: not a findings document ({type(exc).__name__}: {exc})"
            ) from None
        return list(doc.findings), dict(doc.context)
    from trainmedic.diagnose import diagnose_run

    return diagnose_run(record), {}


def _carried(
    record: RunRecord, context: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str], tuple[str, ...]]:
    """What the previous run itself applied with ``--apply-from`` and kept: its loader
    settings, its switches and its dataset types. An unmodified script needs them again
    (its findings no longer ask for what was already applied)."""
    prior = context.get("apply_plan")
    if not isinstance(prior, Mapping):
        return {}, [], ()
    events = record.events
    applied = {e.data.get("remedy") for e in events if e.kind == EventKind.REMEDY_APPLIED}
    reverted = {e.data.get("remedy") for e in events if e.kind == EventKind.REMEDY_REVERTED}
    loader: dict[str, Any] = {}
    if "dataloader" in applied and "dataloader" not in reverted:
        loader = dict(prior.get("dataloader") or {})
    switches = [
        name for name, on in dict(prior.get("switches") or {}).items() if on and name in applied
    ]
    types = tuple(str(t) for t in prior.get("dataset_types") or ())
    return loader, switches, types


def plan_from_run(run_dir: Path) -> ApplyPlan:
    """The plan a previous run's findings and record support."""
    if not (run_dir / "meta.json").exists():
        raise InputError(f"--apply-from {run_dir}: not a trainmedic run directory (no meta.json)")
    from trainmedic.diagnose.view import RunView
    from trainmedic.record.store import load_run_record

    try:
        record = load_run_record(run_dir)
    except Exception as exc:
        raise InputError(f"--apply-from {run_dir}: unreadable run record ({exc})") from None
    findings, context = _findings(run_dir, record)
    loader: dict[str, Any] = {}
    reasons: dict[str, str] = {}
    tf32: list[str] = []
    carried, carried_switches, carried_types = _carried(record, context)
    if carried:
        kept = f"applied in {run_dir} with --apply-from, and kept"
        _merge_loader(loader, reasons, carried, kept, str(run_dir))
    if "tf32_matmul" in carried_switches:
        tf32.append(f"{run_dir} (applied there)")
    for f in findings:
        if f.severity.rank < Severity.WARNING.rank or not f.apply:
            continue
        settings = f.apply.get("dataloader")
        if isinstance(settings, Mapping):
            _merge_loader(loader, reasons, settings, f"{f.id}: {f.title}", str(run_dir))
        torch_switches = f.apply.get("torch")
        if isinstance(torch_switches, Mapping) and torch_switches.get("tf32_matmul"):
            tf32.append(f.id)
    view = RunView.of(record)
    evidence = RunEvidence(
        uses_gpu=view.uses_gpu,
        gpu_busy_share=view.gpu_busy_share,
        compute_capability=view.compute_capability,
        tf32_findings=tuple(tf32),
    )
    switches, switch_reasons = plan_switches(evidence)
    reasons.update(switch_reasons)
    if not loader:
        reasons.setdefault(
            "dataloader", "nothing to change: no finding of the run recommends loader settings"
        )
    if "cudnn_benchmark" in carried_switches and "cudnn_benchmark" not in switches:
        switches["cudnn_benchmark"] = True
        reasons["cudnn_benchmark"] = f"applied in {run_dir} (fixed input shapes seen there)"
    types = carried_types or tuple(
        sorted({lo.dataset_type for lo in view.train_loaders if lo.dataset_type})
    )
    return ApplyPlan(
        str(run_dir), loader, switches, types, reasons, made_for=tuple(record.meta.command)
    )


def plan_from_tuning(path: Path) -> ApplyPlan:
    """The plan of a ``trainmedic tune dataloader --json`` file."""
    try:
        data = read_json(path)
    except (OSError, ValueError) as exc:
        raise InputError(f"--apply-from {path}: not a JSON file ({describe(exc)})") from None
    if not isinstance(data, dict) or data.get("tool") != "tune-dataloader":
        raise InputError(
            f"--apply-from {path}: not a tuning result (write one with "
            "trainmedic tune dataloader MODULE:FACTORY --json FILE)"
        )
    best = data.get("best")
    ci = data.get("speedup_ci")
    if not isinstance(best, dict):
        raise InputError(f"--apply-from {path}: the tuning result has no 'best' settings")
    loader: dict[str, Any] = {}
    reasons: dict[str, str] = {}
    if isinstance(ci, list) and len(ci) == 2 and float(ci[0]) > 1.0:
        why = (
            f"tuned: {float(data.get('speedup', 0)):.2f}x (95 % CI {float(ci[0]):.2f}x-"
            f"{float(ci[1]):.2f}x) over the settings measured"
        )
        _merge_loader(loader, reasons, best, why, str(path))
    else:
        reasons["dataloader"] = (
            "not applied: the tuning did not find settings significantly faster than the "
            "current ones"
        )
    kind = data.get("dataset_type")
    code = data.get("dataset_code")
    return ApplyPlan(
        str(path), loader, {}, (kind,) if isinstance(kind, str) else (), reasons,
        dataset_codes=(code,) if isinstance(code, str) else (),
    )  # fmt: skip
