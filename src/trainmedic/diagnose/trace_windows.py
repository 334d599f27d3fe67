"""Findings from a run's profiler windows, joined to the run's own.

Each window's traces are judged the way ``trainmedic report TRACE`` judges a
trace (:func:`~trainmedic.diagnose.trace_rules.diagnose_trace`), its ranks
compared when there are several (:mod:`trainmedic.diagnose.trace_ranks`).
Then, for the run:

* a cause seen in several windows is one finding: the window where it cost
  the most, with ``profile_windows`` (windows read) and
  ``profile_windows_with_it`` in its evidence, and the trace's file in
  ``profile``;
* the trace's data-wait finding is left out: the run's own input rules
  measured the wait on every step and name what it waits on;
* traces without GPU activity (a CPU job profiled with ``always``) give none.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Sequence

from trainmedic.diagnose.trace_ranks import attribute_waits, compare_ranks
from trainmedic.diagnose.trace_rules import diagnose_trace
from trainmedic.findings.model import Finding
from trainmedic.record.layout import PROFILES_DIR
from trainmedic.traces.windows import WindowTrace

RUN_MEASURES = frozenset({"gpu.waits_for_data"})
"""Trace findings the run's own rules state better (on every step, with the resource)."""
PRECISE_GPU = frozenset({"gpu.host_sync", "gpu.launch_bound", "gpu.pageable_copies",
                         "gpu.allocator_churn"})  # fmt: skip
"""Window findings that name why the GPU idles, where the run's rules can only say that it does."""


def window_findings(windows: Sequence[WindowTrace]) -> list[Finding]:
    """The findings of ``windows`` for the run, one per cause and subject."""
    by_window: dict[int, list[WindowTrace]] = defaultdict(list)
    for w in windows:
        if w.summary.steps and w.summary.device is not None:
            by_window[w.after_step].append(w)
    best: dict[tuple[str, str | None], Finding] = {}
    seen: dict[tuple[str, str | None], int] = defaultdict(int)
    for group in by_window.values():
        summaries = [w.summary for w in group]
        compared = compare_ranks(summaries)
        found: list[tuple[Finding, str]] = [(f, group[0].file) for f in compared]
        for w in group:
            found.extend(
                (f, w.file) for f in attribute_waits(diagnose_trace(w.summary), w.summary, compared)
            )
        in_window: set[tuple[str, str | None]] = set()
        for f, file in found:
            if f.id in RUN_MEASURES:
                continue
            key = (f.id, f.subject)
            in_window.add(key)
            tagged = dataclasses.replace(
                f, evidence={**f.evidence, "profile": f"{PROFILES_DIR}/{file}"}
            )
            if key not in best or (tagged.impact or 0.0) > (best[key].impact or 0.0):
                best[key] = tagged
        for key in in_window:
            seen[key] += 1
    return [
        dataclasses.replace(f, evidence={**f.evidence, "profile_windows": len(by_window),
                                         "profile_windows_with_it": seen[key]})
        for key, f in best.items()
    ]  # fmt: skip
