"""Per-rank figures of a distributed run, for the terminal and the HTML report.

One row per rank: where it ran (node, local rank), its steady steps, step
time, data wait, compute, the rest of the step, samples/s, and its GPU's
utilization and clock when one can be matched to it
(:func:`trainmedic.record.ranks.rank_stats`). Nothing is shown for a run
with fewer than two ranks.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

from rich.console import Console
from rich.table import Table

from trainmedic.record.ranks import RankStats, rank_stats
from trainmedic.record.stats import all_spans, split_steps
from trainmedic.record.types import RunRecord

HEADERS = (
    "rank", "node", "local", "steps", "step time", "data wait", "compute", "other",
    "samples/s", "GPU",
)  # fmt: skip


def ranks_of_record(record: RunRecord) -> list[RankStats]:
    return rank_stats(record, split_steps(all_spans(record)))


def rank_rows(stats: Sequence[RankStats]) -> list[tuple[str, ...]]:
    """The table's rows as text (shared by the terminal and HTML)."""
    rows: list[tuple[str, ...]] = []
    for s in stats:
        gpu = "–"
        if s.gpu is not None:
            parts = [f"GPU{s.gpu.index}"]
            if s.gpu.utilization_pct is not None:
                parts.append(f"{s.gpu.utilization_pct:.0f}%")
            if s.gpu.sm_clock_mhz is not None:
                parts.append(f"{s.gpu.sm_clock_mhz:.0f} MHz")
            if s.gpu.throttled_share:
                parts.append(f"slowed {s.gpu.throttled_share:.0%}")
            gpu = " ".join(parts)
        rows.append(
            (
                str(s.rank),
                s.node or "–",
                "–" if s.local_rank is None else str(s.local_rank),
                f"{s.steps:,}",
                _ms(s.step_time_median_s),
                _ms_share(s.data_wait_s, s.data_wait_share),
                _ms_share(s.compute_s, s.compute_share),
                _ms(s.other_s),
                "–" if s.samples_per_s is None else f"{s.samples_per_s:,.1f}",
                gpu,
            )
        )
    return rows


def render_ranks(console: Console, record: RunRecord) -> None:
    """The per-rank table on the terminal (nothing for fewer than two ranks)."""
    stats = ranks_of_record(record)
    if not stats:
        return
    table = Table(title="ranks (steady steps; times per step)", title_justify="left",
                  show_edge=False, pad_edge=False, box=None)  # fmt: skip
    for h in HEADERS:
        table.add_column(h, justify="right" if h not in ("node", "GPU") else "left")
    for row in rank_rows(stats):
        table.add_row(*row)
    console.print(table)
    console.print()


def node_rows(record: RunRecord) -> list[tuple[str, ...]]:
    """A merged record's nodes: name, directory, ranks, clock offset and accuracy."""
    nodes = record.meta.environment.get("nodes")
    if not isinstance(nodes, list) or len(nodes) < 2:
        return []
    rows: list[tuple[str, ...]] = []
    for n in nodes:
        if not isinstance(n, Mapping):
            continue
        offset, accuracy = n.get("clock_offset_s"), n.get("clock_accuracy_s")
        clock = str(n.get("clock_method") or "")
        if isinstance(offset, (int, float)) and clock != "reference":
            clock = f"{offset * 1000:+,.1f} ms" + (
                f" ± {accuracy * 1000:,.1f} ms" if isinstance(accuracy, (int, float)) else ""
            ) + f" ({n.get('clock_method')}, {n.get('clock_pairs')} steps)"
        ranks = n.get("ranks") or []
        rows.append(
            (
                str(n.get("hostname")),
                str(n.get("run_dir")),
                ",".join(str(r) for r in ranks) if isinstance(ranks, list) else "",
                clock,
            )
        )
    return rows


def render_nodes(console: Console, record: RunRecord) -> None:
    """The nodes of a merged report and how their clocks were aligned."""
    rows = node_rows(record)
    if not rows:
        return
    table = Table(title="nodes (clocks aligned to the first)", title_justify="left",
                  show_edge=False, pad_edge=False, box=None)  # fmt: skip
    for h in ("node", "run directory", "ranks", "clock"):
        table.add_column(h)
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print()


def ranks_html(record: RunRecord) -> str:
    """The per-rank table as an HTML section ('' for fewer than two ranks)."""
    stats = ranks_of_record(record)
    if not stats:
        return ""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in HEADERS)
    body = "\n".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
        for row in rank_rows(stats)
    )
    nodes = ""
    rows = node_rows(record)
    if rows:
        cells = "\n".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
        )
        nodes = (
            '<table class="ranks"><thead><tr><th>node</th><th>run directory</th>'
            f"<th>ranks</th><th>clock</th></tr></thead><tbody>\n{cells}\n</tbody></table>\n"
        )
    return (
        '<h2 id="ranks">Ranks</h2>\n'
        + nodes
        + "<p>Steady steps of each rank; times are per step. A rank "
        "whose data wait stands out while the others' compute grows holds them back in the "
        "all-reduce (see the findings).</p>\n"
        f'<table class="ranks"><thead><tr>{head}</tr></thead><tbody>\n{body}\n</tbody></table>'
    )


def _ms(seconds: float | None) -> str:
    return "–" if seconds is None else f"{seconds * 1000:,.1f} ms"


def _ms_share(seconds: float | None, share: float | None) -> str:
    if seconds is None:
        return "–"
    return _ms(seconds) + ("" if share is None else f" ({share:.0%})")


__all__ = [
    "HEADERS",
    "node_rows",
    "rank_rows",
    "ranks_html",
    "ranks_of_record",
    "render_nodes",
    "render_ranks",
]
