"""The live view on the terminal while the run goes on.

:func:`render_panel` turns a :class:`~trainmedic.supervise.live.status.LiveStatus`
into lines with rich (a small panel; tested at a fixed width);
:func:`plain_line` into one line for logs. :class:`LiveView` is the thread
that shows them: a panel redrawn every second on a terminal, a plain line
every :data:`PLAIN_INTERVAL_S` to stderr otherwise, nothing with ``--quiet``.
"""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from trainmedic.supervise.live.status import GIB, GpuNow, LiveAggregate, LiveStatus

TTY_INTERVAL_S = 1.0
PLAIN_INTERVAL_S = 10.0


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h:d}:{m:02d}:{s:02d}"


def _num(value: float | None, fmt: str, unit: str) -> str:
    return "–" if value is None else f"{value:{fmt}}{unit}"


def _gpu_text(g: GpuNow) -> str:
    parts = [f"GPU{g.index} {_num(g.utilization_pct, '.0f', '%')}"]
    if g.memory_used_bytes is not None and g.memory_total_bytes:
        parts.append(f"{g.memory_used_bytes / GIB:.1f}/{g.memory_total_bytes / GIB:.1f} GiB")
    if g.temperature_c is not None:
        parts.append(f"{g.temperature_c:.0f}°C")
    return " ".join(parts)


def status_fields(s: LiveStatus) -> list[str]:
    """The status as short "label value" fields, in display order."""
    phase = f" ({s.phase})" if s.phase and s.phase != "train" else ""
    wait = None if s.data_wait_share is None else 100 * s.data_wait_share
    fields = [
        f"step {s.steps}{phase}",
        f"{_num(s.steps_per_s, '.2f', '')} steps/s",
        f"{_num(s.samples_per_s, ',.1f', '')} samples/s",
        f"data wait {_num(wait, '.0f', '%')}",
    ]
    fields.extend(_gpu_text(g) for g in s.gpus)
    if s.job_cpu_cores is not None:
        fields.append(f"CPU {s.job_cpu_cores:.1f} cores")
    if s.attempt > 1 or s.attempt_state not in (None, "running"):
        # A restart, or the loop between runs of the job: say where it is.
        state = (s.attempt_state or "").replace("_", " ")
        fields.append(f"attempt {s.attempt} {state}".rstrip())
    return fields


def rank_fields(s: LiveStatus, most: int = 8) -> list[str]:
    """``r0 22ms w1%`` per rank (the first ``most``, then how many more)."""
    out = []
    for r in s.ranks[:most]:
        step = "–" if r.step_time_s is None else f"{r.step_time_s * 1000:.0f}ms"
        wait = "–" if r.data_wait_share is None else f"{r.data_wait_share:.0%}"
        out.append(f"r{r.rank} {step} wait {wait}")
    if len(s.ranks) > most:
        out.append(f"+{len(s.ranks) - most} ranks")
    return out


def plain_line(s: LiveStatus) -> str:
    """One line for a log: ``trainmedic [0:01:23] step 120 | 3.10 steps/s | ...``."""
    line = f"trainmedic [{_clock(s.elapsed_s)}] " + " | ".join(status_fields(s))
    if s.warnings:
        line += " | ▲ " + "; ".join(s.warnings)
    return line


def render_panel(
    s: LiveStatus, title: str, width: int, color_system: str | None = "standard"
) -> list[str]:
    """The panel as terminal lines (with colour codes), each shorter than ``width``."""
    body = Text()
    fields = status_fields(s)
    body.append("  ".join(fields[:4]), style="bold")
    if len(fields) > 4:
        body.append("\n" + "  ".join(fields[4:]))
    if s.ranks:
        body.append("\nranks: " + "  ".join(rank_fields(s)))
    for w in s.warnings:
        body.append("\n▲ " + w, style="yellow")
    panel = Panel(
        body,
        title=f"trainmedic · {title} · {_clock(s.elapsed_s)}",
        title_align="left",
        border_style="dim",
        expand=True,
    )
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=max(20, width),
        force_terminal=color_system is not None,
        color_system=color_system,  # type: ignore[arg-type]
        legacy_windows=False,
        highlight=False,
    )
    console.print(panel, crop=True, overflow="ellipsis")
    return buffer.getvalue().rstrip("\n").split("\n")


class LiveView:
    """Shows the aggregate while the job runs.

    Args:
        mode: ``panel`` (terminal), ``plain`` (a line every ``interval_s``) or ``off``.
        show_panel / show_line: where the output goes (the terminal multiplexer).
        width: the terminal's width now, for the panel.
    """

    def __init__(
        self,
        aggregate: LiveAggregate,
        mode: str,
        title: str,
        show_panel: Callable[[list[str]], bool],
        show_line: Callable[[str], bool],
        clear: Callable[[], None],
        width: Callable[[], int],
        color_system: str | None,
        wall: Callable[[], float] = time.time,
        interval_s: float | None = None,
    ) -> None:
        self.aggregate = aggregate
        self.mode = mode
        self.title = title
        self._show_panel = show_panel
        self._show_line = show_line
        self._clear = clear
        self._width = width
        self._color = color_system
        self._wall = wall
        self.interval_s = interval_s or (TTY_INTERVAL_S if mode == "panel" else PLAIN_INTERVAL_S)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.updates = 0

    def start(self) -> None:
        if self.mode == "off":
            return
        self._thread = threading.Thread(target=self._run, name="trainmedic-live", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if self.mode == "panel":
            self._clear()

    def update(self) -> bool:
        """Show the current status once; ``False`` when it could not be shown now."""
        status = self.aggregate.status(self._wall())
        if self.mode == "panel":
            lines = render_panel(status, self.title, self._width() - 1, self._color)
            shown = self._show_panel(lines)
        else:
            shown = self._show_line(plain_line(status))
        self.updates += int(shown)
        return shown

    def _run(self) -> None:
        # Plain lines wait a full interval first: short jobs print nothing extra.
        wait = self.interval_s
        while not self._stop.wait(wait):
            try:
                shown = self.update()
            except Exception:
                return  # the view is a convenience; the run goes on without it
            # Not at a line start of the job's output: try again soon.
            wait = self.interval_s if shown else min(self.interval_s, 0.5)
