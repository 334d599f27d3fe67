"""Where a step's time goes, as one bar: the first thing the terminal summary and
the HTML report show.

A steady step's wall time splits into the wait for the next batch, the host
time inside forward, backward and the optimizer (the probe times them as one
region), and the rest of the host's time in the loop (logging, syncs, the
loop's own Python). The GPU runs beside the host, so its busy time is a
share of the same step time said next to the bar, not a part of it. One bar
for the job and, for a distributed run, one per rank (the ranks with the
most waiting first when there are more than :data:`MAX_RANK_BARS`).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text

from trainmedic.record.ranks import RankStats
from trainmedic.record.stats import RunSummary
from trainmedic.report.facts import format_percent

MAX_RANK_BARS = 8
BAR_CELLS = 40
"""The terminal bar's width, characters (narrower on a narrow terminal)."""


@dataclass(frozen=True)
class Part:
    """One part of the bar: its name, its share of step time, how it is drawn."""

    key: str
    name: str
    share: float
    char: str
    style: str
    colour: str


PARTS = {
    "data": ("waiting for data", "▒", "yellow", "#e0a800"),
    "between": ("between steps", "▒", "yellow", "#e0a800"),
    "compute": ("forward/backward/optimizer", "█", "green", "#2e7d32"),
    "other": ("other host work", "░", "blue", "#5c6bc0"),
    "step": ("in the step, not split", "▓", "white", "#9e9e9e"),
}
"""key -> (name, terminal character, terminal style, HTML colour). Each part has its own
character so that the bar reads the same without colour (``NO_COLOR``, a file)."""


@dataclass(frozen=True)
class Breakdown:
    """One bar: ``who`` (``job``, ``rank 3``), its parts (shares of steady step time,
    summing to 1), the GPU's busy share beside it, and the steps it covers."""

    who: str
    parts: tuple[Part, ...]
    gpu_busy: float | None
    steps: int


def _parts(data: float | None, compute: float | None, loader: bool) -> tuple[Part, ...]:
    """The parts; without a DataLoader the probe counts all host time between steps as
    the wait (the loop prepares its batches there), and the part is named so."""
    if data is None:
        return ()
    data = min(max(data, 0.0), 1.0)
    shares = {"data" if loader else "between": data}
    if compute is None:
        shares["step"] = 1.0 - data
    else:
        compute = min(max(compute, 0.0), 1.0 - data)
        shares["compute"] = compute
        shares["other"] = 1.0 - data - compute
    # A remainder of float rounding is no part at all.
    shares = {k: (v if v >= 1e-4 else 0.0) for k, v in shares.items()}
    return tuple(Part(k, *PARTS[k][:1], v, *PARTS[k][1:]) for k, v in shares.items())


def of_summary(s: RunSummary, loader: bool = True) -> Breakdown | None:
    """The job's bar (``None`` without steady steps)."""
    parts = _parts(s.data_wait_share, s.compute_share, loader)
    if not parts or s.steps_steady <= 0:
        return None
    return Breakdown("job", parts, s.gpu_time_share, s.steps_steady)


def of_ranks(stats: Sequence[RankStats], loader: bool = True) -> list[Breakdown]:
    """One bar per rank; the :data:`MAX_RANK_BARS` that wait most when there are more."""
    bars = []
    for r in stats:
        parts = _parts(r.data_wait_share, r.compute_share, loader)
        if not parts or r.steps <= 0:
            continue
        gpu = (r.gpu_time_s / r.step_time_s
               if r.gpu_time_s is not None and r.step_time_s else None)  # fmt: skip
        bars.append(Breakdown(f"rank {r.rank}", parts, gpu, r.steps))
    if len(bars) > MAX_RANK_BARS:
        waits = sorted(bars, key=lambda b: -b.parts[0].share)[:MAX_RANK_BARS]
        bars = [b for b in bars if b in waits]
    return bars


def _cells(parts: Sequence[Part], width: int) -> list[int]:
    """Characters per part: largest remainders, so they add up to ``width`` and no
    part of 1 % or more vanishes."""
    raw = [p.share * width for p in parts]
    cells = [int(x) for x in raw]
    for i in sorted(range(len(raw)), key=lambda i: -(raw[i] - cells[i])):
        if sum(cells) >= width:
            break
        cells[i] += 1
    for i, p in enumerate(parts):
        if p.share >= 0.01 and cells[i] == 0:
            j = max(range(len(cells)), key=lambda k: cells[k])
            cells[j] -= 1
            cells[i] = 1
    return cells


def bar_text(b: Breakdown, width: int = BAR_CELLS) -> Text:
    """The bar for a terminal: ``width`` characters, one per part's share."""
    text = Text()
    for part, n in zip(b.parts, _cells(b.parts, width), strict=True):
        text.append(part.char * n, style=part.style)
    return text


def legend_keys(b: Breakdown) -> list[Text]:
    """What the bar's parts are, one key each (``▒ waiting for data 59%``), and the
    GPU's busy share when measured."""
    keys = []
    for part in b.parts:
        if part.share <= 0:
            continue  # not in the bar either
        key = Text(part.char, style=part.style)
        key.append(f" {part.name} {format_percent(part.share)}")
        keys.append(key)
    if b.gpu_busy is not None:
        keys.append(Text(f"GPU busy {format_percent(min(b.gpu_busy, 1.0))} of it"))
    return keys


def legend_lines(b: Breakdown, width: int) -> list[Text]:
    """The legend's keys packed into lines of at most ``width`` characters, a key
    never split across two."""
    lines: list[Text] = []
    for key in legend_keys(b):
        if lines and len(lines[-1]) + 2 + len(key) <= width:
            lines[-1].append("  ")
            lines[-1].append(key)
        else:
            lines.append(key.copy())
    return lines


def bar_html(b: Breakdown) -> str:
    """The bar as HTML: a row of coloured blocks whose widths are the shares."""
    blocks = "".join(
        f'<span class="part" style="width:{p.share * 100:.2f}%;background:{p.colour}" '
        f'title="{html.escape(p.name)} {format_percent(p.share)}"></span>'
        for p in b.parts
        if p.share > 0
    )
    legend = " ".join(
        f'<span class="key"><span class="swatch" style="background:{p.colour}"></span>'
        f"{html.escape(p.name)} <b>{format_percent(p.share)}</b></span>"
        for p in b.parts
    )
    if b.gpu_busy is not None:
        legend += (f' <span class="key">GPU busy <b>{format_percent(min(b.gpu_busy, 1.0))}'
                   "</b> of it</span>")  # fmt: skip
    return (
        f'<div class="breakdown"><div class="who">{html.escape(b.who)}</div>'
        f'<div class="bar">{blocks}</div><div class="legend">{legend}</div></div>'
    )
