"""Strategies and checks shared by the fuzz suites.

:func:`mutated` takes a valid document (a simulation file, a record line, a
manifest) and changes one to three places in it: a value replaced by any
JSON value (huge and non-finite numbers, deep nesting, odd strings), a key
deleted, a key added. Structure-aware mutation reaches the code behind the
first ``isinstance`` check, which random bytes almost never do.
"""

from __future__ import annotations

import contextlib
import copy
import io
import os
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from trainmedic.cli.main import main

FUZZ = settings(
    # TRAINMEDIC_FUZZ_EXAMPLES=2000 hunts longer (the default keeps the suite fast).
    max_examples=int(os.environ.get("TRAINMEDIC_FUZZ_EXAMPLES", "40")),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
"""Each fuzz test's budget: the whole fuzz suite stays within about 20 s on 2 cores."""

_NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 10**400, -(10**400), 2**63, 1e308, 5e-324]),
)
_STRINGS = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["", "\x00", "\udcff", "..", "/", "{checkpoint}", "nan", "1e999", "-1"]),
)
SCALARS = st.one_of(st.none(), st.booleans(), _NUMBERS, _STRINGS)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(_STRINGS, kids, max_size=4),
    max_leaves=12,
)
DEEP = st.integers(min_value=60, max_value=3000).map(lambda n: "[" * n + "]" * n)


@st.composite
def mutated(draw: st.DrawFn, document: Any, max_changes: int = 3) -> Any:
    """``document`` with 1..``max_changes`` places changed (see the module docstring)."""
    doc = copy.deepcopy(document)
    for _ in range(draw(st.integers(1, max_changes))):
        doc = _mutate_once(draw, doc)
    return doc


def _mutate_once(draw: st.DrawFn, doc: Any) -> Any:
    depth = draw(st.integers(0, 5))
    parent: Any = None
    key: Any = None
    node = doc
    for _ in range(depth):
        if isinstance(node, dict) and node:
            k: Any = draw(st.sampled_from(sorted(node, key=str)))
        elif isinstance(node, list) and node:
            k = draw(st.integers(0, len(node) - 1))
        else:
            break
        parent, key, node = node, k, node[k]
    action = draw(st.sampled_from(["replace", "delete", "add"]))
    if parent is None:
        return draw(JSON_VALUES) if action == "replace" else doc
    if action == "replace":
        parent[key] = draw(JSON_VALUES)
    elif action == "delete":
        del parent[key]
    elif isinstance(parent, dict):
        parent[draw(_STRINGS)] = draw(JSON_VALUES)
    else:
        parent.insert(key, draw(JSON_VALUES))
    return doc


def run_cli(args: Sequence[str]) -> tuple[int, str, str]:
    """``main(args)`` in this process, with stdout and stderr captured."""
    out, err = io.StringIO(), io.StringIO()
    # An error no check foresaw then escapes with its traceback, which the
    # failing example shows, instead of as main's one-line "internal error".
    os.environ["TRAINMEDIC_DEBUG"] = "1"
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        del os.environ["TRAINMEDIC_DEBUG"]
    return code, out.getvalue(), err.getvalue()


def assert_clean(code: int, err: str, ok: Sequence[int] = (0,)) -> None:
    """Success (``code`` in ``ok``) or a one-line error; never a traceback or an internal error."""
    assert "Traceback" not in err, err
    assert "internal error" not in err, err
    if code in ok:
        return
    lines = [line for line in err.splitlines() if line.startswith("trainmedic: error: ")]
    assert len(lines) == 1, (code, err)
    assert code in (1, 2, 126, 127), (code, err)
