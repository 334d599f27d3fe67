"""A Python frame as the stack classifiers see it, and what it is calling.

:class:`FrameInfo` is what :mod:`trainmedic.probe.stacks` and
:mod:`trainmedic.probe.host_states` classify; :func:`is_library` tells the
job's own code from libraries. Only Python frames are visible to the probe,
so a C call made from Python (``f.read()``, ``cv2.imread``,
``dist.all_reduce``) leaves the caller as the innermost frame; the instruction
the caller is at tells which function it calls (:func:`callee_names`; the
heartbeat, :mod:`trainmedic.probe.liveness`, and the stack dumps,
:mod:`trainmedic.probe.forensics`, use it too).
"""

from __future__ import annotations

import dis
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from types import CodeType

from trainmedic.frame_tables import THREADING_WAITS


@dataclass(frozen=True)
class FrameInfo:
    """One Python frame as classification needs it.

    Attributes:
        callees: for the innermost frame, the names of the call it is making
            (``("np", "load")`` for ``np.load(path)``), else empty.
    """

    filename: str
    lineno: int
    function: str
    callees: tuple[str, ...] = ()

    @property
    def path(self) -> str:
        return self.filename.replace("\\", "/")


def _library_roots() -> tuple[str, ...]:
    roots: set[str] = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            path = sysconfig.get_paths().get(key)
        except Exception:  # sysconfig can fail in odd installs; fall back to markers
            path = None
        if path:
            roots.add(path.replace("\\", "/").rstrip("/") + "/")
    return tuple(sorted(roots))


_LIBRARY_ROOTS = _library_roots()


def is_library(filename: str) -> bool:
    """Whether ``filename`` belongs to the standard library or an installed package."""
    path = filename.replace("\\", "/")
    if (
        "/site-packages/" in path
        or "/dist-packages/" in path
        or "/trainmedic/probe/" in path
        or path.startswith("<")
    ):
        return True
    return path.startswith(_LIBRARY_ROOTS)


_LOAD_OPS = frozenset(
    {
        "LOAD_GLOBAL",
        "LOAD_NAME",
        "LOAD_ATTR",
        "LOAD_METHOD",
        "LOAD_FAST",
        "LOAD_FAST_CHECK",
        "LOAD_FAST_BORROW",
        "LOAD_DEREF",
        "LOAD_CLASSDEREF",
        "LOAD_FROM_DICT_OR_GLOBALS",
        "LOAD_FROM_DICT_OR_DEREF",
        "LOAD_SUPER_ATTR",
    }
)

_CALL_OPS = frozenset(
    {
        "CALL",
        "CALL_KW",
        "CALL_FUNCTION",
        "CALL_METHOD",
        "CALL_FUNCTION_KW",
        "CALL_FUNCTION_EX",
        "PRECALL",
    }
)

_code_cache: dict[CodeType, tuple[list[dis.Instruction], dict[int, int]]] = {}
_callee_cache: dict[tuple[CodeType, int], tuple[str, ...]] = {}
CACHE_MAX = 4096
"""Entries a cache of this kind holds before it is emptied."""


def threading_blocks(frames: Sequence[FrameInfo]) -> bool:
    """Whether a stack whose innermost frames are ``threading.py``'s may be blocked there.

    It may when one of those frames is a function that can wait
    (:data:`trainmedic.frame_tables.THREADING_WAITS`: ``Condition.wait`` and what it
    calls, a semaphore's acquire, a join ...); ``stop.is_set()`` or ``event.set()``
    (``notify``) return at once. ``frames``: innermost first."""
    for frame in frames:
        if not frame.path.endswith("/threading.py"):
            return False
        if frame.function in THREADING_WAITS:
            return True
    return False


def _instructions(code: CodeType) -> tuple[list[dis.Instruction], dict[int, int]]:
    cached = _code_cache.get(code)
    if cached is None:
        if len(_code_cache) >= CACHE_MAX:
            _code_cache.clear()
        instrs = list(dis.get_instructions(code))
        cached = (instrs, {ins.offset: i for i, ins in enumerate(instrs)})
        _code_cache[code] = cached
    return cached


def callee_names(code: CodeType, lasti: int) -> tuple[str, ...]:
    """The dotted name of what the instruction at ``lasti`` is calling, as parts.

    ``np.load(p)`` gives ``("np", "load")``, ``open(p).read()`` at the ``read``
    call gives ``("open", "read")``; empty when the instruction is no call or
    the name cannot be told. Cached per (code, offset).
    """
    key = (code, lasti)
    cached = _callee_cache.get(key)
    if cached is not None:
        return cached
    if len(_callee_cache) >= CACHE_MAX:
        _callee_cache.clear()
    names = _callee_names(code, lasti)
    _callee_cache[key] = names
    return names


def _callee_names(code: CodeType, lasti: int) -> tuple[str, ...]:
    instrs, index = _instructions(code)
    i = index.get(lasti)
    if i is None:
        return ()
    call = instrs[i]
    if call.opname not in _CALL_OPS:
        return ()
    pos = getattr(call, "positions", None)
    if pos is not None and pos.lineno is not None and pos.col_offset is not None:
        # The callee expression starts where the whole call expression starts.
        names = []
        for ins in instrs[:i]:
            where = getattr(ins, "positions", None)
            if (
                ins.opname in _LOAD_OPS
                and where is not None
                and where.lineno == pos.lineno
                and where.col_offset == pos.col_offset
                and isinstance(ins.argval, str)
            ):
                names.append(ins.argval)
        return tuple(names)
    # Python 3.10: no column positions; take the names loaded on the call's line.
    line = None
    names = []
    for ins in instrs[: i + 1]:
        if ins.starts_line is not None:
            line = ins.starts_line
            names = []
        if ins.opname in _LOAD_OPS and isinstance(ins.argval, str):
            names.append(ins.argval)
    return tuple(names) if line is not None else ()
