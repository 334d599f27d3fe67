"""Incidents: each failed attempt of the run, and the run's restarts and goodput.

The supervisor records every attempt as an ``attempt_end`` event; this rule
turns them back into findings (:func:`trainmedic.resilience.incidents.incident_findings`),
so a run diagnosed again later (``trainmedic report``) shows the same
incidents. A run whose first attempt succeeded gets none.
"""

from __future__ import annotations

from trainmedic.diagnose.thresholds import Thresholds
from trainmedic.diagnose.view import RunView
from trainmedic.findings.model import Finding
from trainmedic.resilience.incidents import attempts_from_events, incident_findings


def incidents(view: RunView, th: Thresholds) -> list[Finding]:
    """One finding per failed attempt and one for the restarts (see module docstring)."""
    record = view.record
    attempts = attempts_from_events(record.events)
    return incident_findings(attempts, record.meta.started_at, record.meta.ended_at)
