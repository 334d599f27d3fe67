"""Run the validation corpus and print its confusion table (docs/diagnosis.md).

Every case of ``tests/e2e/corpus.py`` is a real training script run under
``trainmedic run`` on CPU, slow for one known reason. The table counts, per
expected category, the category of the first finding that counts (other
people's CPU load on a shared machine skipped, as the tests do); ``busy``
counts runs where others starved the loader so the case could not show its
own cause. Then one line per run: expected and found finding, wall time and
trainmedic's own CPU.

    .venv/bin/python benchmarks/diagnosis_corpus.py [--repeat N] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "e2e"))

from corpus import CASES, Outcome, run_case, servers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1, help="runs of every case")
    parser.add_argument("--only", nargs="*", default=None, metavar="NAME", help="these cases")
    args = parser.parse_args()
    cases = [c for c in CASES if args.only is None or c.name in args.only]
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="trainmedic-corpus-") as tmp:
        for r in range(args.repeat):
            for case in cases:
                work = Path(tmp) / f"{r}-{case.name}"
                work.mkdir()
                with servers(work) as env:
                    o = run_case(case, env)
                outcomes.append(o)
                print(
                    f"{case.name:26} {o.result:9} expected {case.expected:20} got {o.got:40} "
                    f"{o.wall_s:5.1f} s  supervisor "
                    + ("?" if o.supervisor_cpu_share is None else f"{o.supervisor_cpu_share:.1%}"),
                    file=sys.stderr,
                    flush=True,
                )
    print(confusion_table(outcomes))
    print()
    print(case_table(outcomes))
    return 0 if all(o.result != "mismatch" for o in outcomes) else 1


def label(o: Outcome, expected: bool) -> str:
    """A run's row (``expected``) or column label: the category, ``healthy`` for no
    warning or error, ``busy`` when others starved the loader, ``none``."""
    if expected:
        return "healthy" if o.case.expected == "run.healthy" else o.case.category
    if o.result == "busy":
        return "busy"
    if o.case.expected == "run.healthy" and o.result == "match":
        return "healthy"
    return o.first["category"] if o.first else "none"


def confusion_table(outcomes: list[Outcome]) -> str:
    """Expected category (rows) x category of the first finding (columns), as markdown;
    ``right`` counts runs whose first finding was the expected one (id and category)."""
    rows = sorted({label(o, True) for o in outcomes})
    found: Counter[tuple[str, str]] = Counter((label(o, True), label(o, False)) for o in outcomes)
    columns = {label(o, False) for o in outcomes} | set(rows)
    cols = sorted(columns - {"busy", "none"}) + [c for c in ("none", "busy") if c in columns]
    lines = [
        "| expected \\ first finding | " + " | ".join(cols) + " | runs | right |",
        "|---|" + "---|" * (len(cols) + 2),
    ]
    for r in rows:
        counts = [found[(r, c)] for c in cols]
        runs = sum(counts)
        judged = [o for o in outcomes if label(o, True) == r and o.result != "busy"]
        right = sum(1 for o in judged if o.result == "match")
        cells = " | ".join(str(n) if n else "." for n in counts)
        lines.append(f"| {r} | {cells} | {runs} | {right}/{len(judged)} |")
    return "\n".join(lines)


def case_table(outcomes: list[Outcome]) -> str:
    lines = [
        "| case | kind | expected | first finding | result | wall s | supervisor CPU |",
        "|---|---|---|---|---|---|---|",
    ]
    for o in outcomes:
        share = "?" if o.supervisor_cpu_share is None else f"{o.supervisor_cpu_share:.1%}"
        lines.append(
            f"| {o.case.name} | {o.case.kind} | {o.case.expected} | {o.got} | {o.result} "
            f"| {o.wall_s:.1f} | {share} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
