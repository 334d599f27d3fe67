"""Typed data of the structured events, read and written in one place.

An event's ``data`` is JSON on disk; the kinds whose data other parts read
field by field have a dataclass here that writes it (``to_data``) and reads
it back checked (``of``: a field of the wrong type reads as absent, so a
record from another version or a hand-edited one cannot mislead a reader).
A hang's is :class:`HangDetected`. The attempt's end has its own in
:class:`trainmedic.resilience.incidents.AttemptSummary`, an Xid's in
:func:`trainmedic.gpu.faults.xid_from_report`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from trainmedic.record.events import EventKind
from trainmedic.record.types import RunEvent

PROCESS_KINDS = (EventKind.PROCESS_START, EventKind.PROCESS_ROLE)
"""The kinds that say who a probed process is."""


@dataclass(frozen=True)
class ProcessStart:
    """Who a probed process is: the data of ``process_start`` and ``process_role``.

    Attributes:
        pid / ppid: the process and its parent (in the host's numbering).
        role: ``process`` (a training process), ``forked``, ``worker`` (a DataLoader's).
        rank / local_rank / node_rank / world_size: a distributed job's
            ``RANK``, ``LOCAL_RANK``, torchrun's ``GROUP_RANK``, ``WORLD_SIZE``.
        node: the host's name.
        argv / python: its command line and interpreter.
    """

    pid: int | None = None
    ppid: int | None = None
    role: str = "process"
    rank: int | None = None
    local_rank: int | None = None
    node: str | None = None
    node_rank: int | None = None
    world_size: int | None = None
    argv: tuple[str, ...] = ()
    python: str | None = None

    def to_data(self) -> dict[str, Any]:
        """The event's ``data``: every field, ``argv`` as a list."""
        return {
            "pid": self.pid,
            "ppid": self.ppid,
            "role": self.role,
            "rank": self.rank,
            "local_rank": self.local_rank,
            "node": self.node,
            "node_rank": self.node_rank,
            "world_size": self.world_size,
            "argv": list(self.argv),
            "python": self.python,
        }

    @classmethod
    def of(cls, e: RunEvent) -> ProcessStart | None:
        """The payload of ``e``; ``None`` when ``e`` is not of :data:`PROCESS_KINDS`."""
        if e.kind not in PROCESS_KINDS:
            return None
        d = e.data
        role = d.get("role")
        argv = d.get("argv")
        return cls(
            pid=_int(d, "pid"),
            ppid=_int(d, "ppid"),
            role=role if isinstance(role, str) and role else "process",
            rank=_int(d, "rank"),
            local_rank=_int(d, "local_rank"),
            node=_str(d, "node"),
            node_rank=_int(d, "node_rank"),
            world_size=_int(d, "world_size"),
            argv=tuple(a for a in argv if isinstance(a, str)) if isinstance(argv, list) else (),
            python=_str(d, "python"),
        )


def process_starts(events: Iterable[RunEvent]) -> list[tuple[RunEvent, ProcessStart]]:
    """The events of :data:`PROCESS_KINDS` among ``events``, each with its payload."""
    out = []
    for e in events:
        p = ProcessStart.of(e)
        if p is not None:
            out.append((e, p))
    return out


@dataclass(frozen=True)
class HangDetected:
    """What the supervisor decided when it called an attempt hung: the data of
    ``hang_detected``.

    Attributes:
        attempt: the attempt's number (1 for the first).
        reason: the timeout's verdict in one line.
        basis: what the timeout was based on (``steps``, ``startup``, ``phase``...).
        bound_s: the timeout in force, seconds.
        silent_s / quiet_s: seconds without a step / without any sign of life.
        extended: evidence of work had moved the deadline past ``bound_s``.
        silence: the class of the silence (``blocked``, ``spinning``, ``peer_wait``,
            ``source_wait``, ``work``, ``unclear``), ``None`` when unjudged.
        location: where the job hung (``file:line function``), from the stacks.
        directory: the attempt's forensics directory, relative to the run directory.
        files: the forensics files written there.
        notes: what could not be taken, in words.
        forensics_s: seconds the forensics took.
        evidence: the silence's evidence as recorded (``JobEvidence.to_data``).
        first_stopped: in a distributed job, the rank that stopped first.
    """

    attempt: int | None = None
    reason: str | None = None
    basis: str | None = None
    bound_s: float | None = None
    silent_s: float | None = None
    quiet_s: float | None = None
    extended: bool = False
    silence: str | None = None
    location: str | None = None
    directory: str | None = None
    files: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    forensics_s: float | None = None
    evidence: Mapping[str, Any] | None = None
    first_stopped: Mapping[str, Any] | None = None

    def to_data(self) -> dict[str, Any]:
        """The event's ``data``; the optional mappings only when present."""
        data: dict[str, Any] = {
            "attempt": self.attempt,
            "reason": self.reason,
            "basis": self.basis,
            "bound_s": _round(self.bound_s),
            "silent_s": _round(self.silent_s),
            "quiet_s": _round(self.quiet_s),
            "extended": self.extended,
            "silence": self.silence,
            "location": self.location,
            "directory": self.directory,
            "files": list(self.files),
            "notes": list(self.notes),
            "forensics_s": _round(self.forensics_s),
        }
        if self.evidence is not None:
            data["evidence"] = dict(self.evidence)
        if self.first_stopped is not None:
            data["first_stopped"] = dict(self.first_stopped)
        return data

    @classmethod
    def of(cls, e: RunEvent) -> HangDetected | None:
        """The payload of ``e``; ``None`` when ``e`` is not ``hang_detected``."""
        if e.kind != EventKind.HANG_DETECTED:
            return None
        d = e.data
        evidence, first = d.get("evidence"), d.get("first_stopped")
        return cls(
            attempt=_int(d, "attempt"),
            reason=_str(d, "reason"),
            basis=_str(d, "basis"),
            bound_s=_float(d, "bound_s"),
            silent_s=_float(d, "silent_s"),
            quiet_s=_float(d, "quiet_s"),
            extended=d.get("extended") is True,
            silence=_str(d, "silence"),
            location=_str(d, "location"),
            directory=_str(d, "directory"),
            files=_strs(d, "files"),
            notes=_strs(d, "notes"),
            forensics_s=_float(d, "forensics_s"),
            evidence=evidence if isinstance(evidence, dict) else None,
            first_stopped=first if isinstance(first, dict) else None,
        )


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 3)


def _float(d: Mapping[str, Any], key: str) -> float | None:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v < 0:
        return None
    return float(v)


def _strs(d: Mapping[str, Any], key: str) -> tuple[str, ...]:
    v = d.get(key)
    return tuple(x for x in v if isinstance(x, str)) if isinstance(v, list) else ()


def _int(d: Mapping[str, Any], key: str) -> int | None:
    v = d.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _str(d: Mapping[str, Any], key: str) -> str | None:
    v = d.get(key)
    return v if isinstance(v, str) else None
