"""Typed data of the structured events, read and written in one place.

An event's ``data`` is JSON on disk; the kinds whose data other parts read
field by field have a dataclass here that writes it (``to_data``) and reads
it back checked (``of``: a field of the wrong type reads as absent, so a
record from another version or a hand-edited one cannot mislead a reader).
The attempt's end has its own in :class:`trainmedic.resilience.incidents.AttemptSummary`,
an Xid's in :func:`trainmedic.gpu.faults.xid_from_report`.
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


def _int(d: Mapping[str, Any], key: str) -> int | None:
    v = d.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _str(d: Mapping[str, Any], key: str) -> str | None:
    v = d.get(key)
    return v if isinstance(v, str) else None
