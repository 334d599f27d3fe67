"""``dcgmi diag``: NVIDIA's own diagnostic, run when it is installed, its verdicts read.

``dcgmi diag -r LEVEL -j`` prints JSON: ``{"DCGM GPU Diagnostic" | "DCGM Diagnostic":
{"test_categories": [{"category", "tests": [{"name", "results": [...]}]}]}}``. A result
names its GPU as ``gpu_id``/``gpu_ids`` (DCGM 2-3) or ``entity_group``/``entity_id``
(DCGM 4), its ``status`` (``Pass``, ``Fail``, ``Warn``, ``Skip``, ``Not Run``) and its
messages under ``warnings`` and ``info``. The command runs without a shell, under a time
limit that grows with the level.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

LEVEL_TIMEOUT_S: Mapping[int, float] = {1: 120.0, 2: 900.0, 3: 3600.0, 4: 3 * 3600.0}
"""Time limit of ``dcgmi diag -r LEVEL``, seconds: level 1 takes seconds, 2 about two
minutes, 3 about half an hour and 4 over an hour on 8 GPUs (DCGM user guide)."""


@dataclass(frozen=True)
class DcgmVerdict:
    """One test's verdict for one GPU (``gpu`` is ``None`` for a system-wide test)."""

    category: str
    test: str
    gpu: int | None
    status: str
    messages: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        return self.status.lower() in ("fail", "failed", "error")

    @property
    def warned(self) -> bool:
        return self.status.lower() in ("warn", "warning")


@dataclass(frozen=True)
class DcgmOutcome:
    """What ``--dcgm`` gave.

    Attributes:
        level: the ``-r`` level asked for.
        ran: ``dcgmi`` ran and its JSON was read.
        note: one line when it did not (not installed, failed, timed out, unreadable).
        verdicts: every test's verdict per GPU, in dcgmi's order.
    """

    level: int
    ran: bool
    note: str | None = None
    verdicts: tuple[DcgmVerdict, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "ran": self.ran,
            "note": self.note,
            "verdicts": [
                {
                    "category": v.category,
                    "test": v.test,
                    "gpu": v.gpu,
                    "status": v.status,
                    "messages": list(v.messages),
                }
                for v in self.verdicts
            ],
        }


Runner = Callable[..., "subprocess.CompletedProcess[str]"]


def run_dcgm_diag(
    level: int,
    which: Callable[[str], str | None] = shutil.which,
    run: Runner = subprocess.run,
) -> DcgmOutcome:
    """Run ``dcgmi diag -r level -j`` when ``dcgmi`` is on PATH and read its verdicts."""
    exe = which("dcgmi")
    if exe is None:
        return DcgmOutcome(
            level,
            False,
            "dcgmi is not installed: NVIDIA's diagnostic not run "
            "(install datacenter-gpu-manager for --dcgm)",
        )
    timeout = LEVEL_TIMEOUT_S.get(level, LEVEL_TIMEOUT_S[4])
    try:
        done = run(
            [exe, "diag", "-r", str(level), "-j"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return DcgmOutcome(level, False, f"dcgmi diag -r {level} ran past {timeout:.0f} s")
    except OSError as exc:
        return DcgmOutcome(level, False, f"dcgmi could not start: {exc.strerror or exc}")
    try:
        verdicts = parse_diag_json(done.stdout)
    except ValueError as exc:
        said = " ".join((done.stderr or done.stdout or "").split())[:200]
        return DcgmOutcome(
            level,
            False,
            f"dcgmi diag exited {done.returncode}: {exc}" + (f": {said}" if said else ""),
        )
    return DcgmOutcome(level, True, None, verdicts)


def parse_diag_json(text: str) -> tuple[DcgmVerdict, ...]:
    """The verdicts of ``dcgmi diag -j``'s output.

    Raises:
        ValueError: not JSON, or no ``test_categories`` in it.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        raise ValueError("its output is not JSON") from None
    body = _diagnostic_body(data)
    if body is None:
        raise ValueError("no test_categories in its JSON")
    out: list[DcgmVerdict] = []
    for cat in _list(body.get("test_categories")):
        category = str(cat.get("category", "")) if isinstance(cat, Mapping) else ""
        for test in _list(cat.get("tests") if isinstance(cat, Mapping) else None):
            if not isinstance(test, Mapping):
                continue
            name = str(test.get("name", "?"))
            for result in _list(test.get("results")):
                if isinstance(result, Mapping):
                    out.extend(_verdicts(category, name, result))
    return tuple(out)


def _diagnostic_body(data: Any) -> Mapping[str, Any] | None:
    if not isinstance(data, Mapping):
        return None
    for key in ("DCGM GPU Diagnostic", "DCGM Diagnostic"):
        body = data.get(key)
        if isinstance(body, Mapping) and "test_categories" in body:
            return body
    return data if "test_categories" in data else None


def _list(value: Any) -> Sequence[Any]:
    return value if isinstance(value, list) else ()


def _verdicts(category: str, test: str, result: Mapping[str, Any]) -> list[DcgmVerdict]:
    status = str(result.get("status", "?"))
    messages = tuple(_messages(result))
    gpus = _gpus(result)
    return [DcgmVerdict(category, test, gpu, status, messages) for gpu in gpus]


def _gpus(result: Mapping[str, Any]) -> list[int | None]:
    if "entity_id" in result:
        group = str(result.get("entity_group", "GPU")).upper()
        return [_int(result["entity_id"])] if group == "GPU" else [None]
    raw = result.get("gpu_ids", result.get("gpu_id"))
    if raw is None:
        return [None]
    parts = raw if isinstance(raw, list) else str(raw).split(",")
    found = [_int(p) for p in parts if str(p).strip()]
    return found or [None]


def _int(value: Any) -> int | None:
    try:
        return int(str(value).strip())
    except ValueError:
        return None


def _messages(result: Mapping[str, Any]) -> list[str]:
    out: list[str] = []
    for key in ("warnings", "errors", "info"):
        value = result.get(key)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, Mapping):
                item = item.get("warning") or item.get("error") or item.get("message")
            if isinstance(item, str) and item.strip():
                out.append(" ".join(item.split()))
    return out
