"""``trainmedic bench``: the plan of repeated, interleaved runs of two commands.

Proving a fix on a shared machine takes repeated runs of both commands, run in
turns so that the machine's slow drifts (another tenant arriving, the page cache
warming, clocks) fall on both alike. The rounds alternate which command goes
first (A B, B A, A B, ...): a drift within a round then favours neither side
across rounds. Each run is an ordinary ``trainmedic run`` into a directory of its
own inside the bench directory; the comparison is ``trainmedic compare`` of the
finished runs of each side (:func:`trainmedic.report.compare.compare_groups`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SEPARATOR = ":::"
"""Between the two commands: ``trainmedic bench -- CMD_A ::: CMD_B``."""


@dataclass(frozen=True)
class PlannedRun:
    """One run of the bench.

    Attributes:
        side: ``a`` or ``b``.
        number: the run's number within its side, from 1.
        command: the command to run under ``trainmedic run``.
    """

    side: str
    number: int
    command: tuple[str, ...]

    @property
    def name(self) -> str:
        """The run directory's name in the bench directory: ``a-1``, ``b-3``."""
        return f"{self.side}-{self.number}"


def split_commands(argv: Sequence[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``CMD_A ::: CMD_B`` as the two commands.

    Raises:
        ValueError: no separator, more than one, or an empty side (the message says
            which).
    """
    if SEPARATOR not in argv:
        raise ValueError(f"give two commands separated by {SEPARATOR}: -- CMD_A {SEPARATOR} CMD_B")
    i = list(argv).index(SEPARATOR)
    a, b = tuple(argv[:i]), tuple(argv[i + 1 :])
    if SEPARATOR in b:
        raise ValueError(f"give exactly two commands: one {SEPARATOR}, not more")
    if not a or not b:
        raise ValueError(f"a command is empty: {'before' if not a else 'after'} {SEPARATOR}")
    return a, b


def plan(a: Sequence[str], b: Sequence[str], runs: int) -> list[PlannedRun]:
    """``runs`` runs of each command, in rounds that alternate which goes first."""
    order: list[PlannedRun] = []
    for i in range(1, runs + 1):
        pair = [PlannedRun("a", i, tuple(a)), PlannedRun("b", i, tuple(b))]
        order.extend(pair if i % 2 else pair[::-1])
    return order


def run_argv(python: str, run: PlannedRun, directory: Path) -> list[str]:
    """The ``trainmedic run`` command line of ``run`` into ``directory``."""
    return [python, "-m", "trainmedic", "run", "--quiet", "--no-html", "--out", str(directory),
            "--", *run.command]  # fmt: skip
