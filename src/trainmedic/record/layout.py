"""The names of a run directory's files: one home for them (docs/run-record.md)."""

from __future__ import annotations

from trainmedic.record.events import EventKind

META_FILE = "meta.json"
STEPS_FILE = "steps.jsonl"
WINDOWS_FILE = "windows.jsonl"
GPU_FILE = "gpu.jsonl"
HOST_FILE = "host.jsonl"
LOADERS_FILE = "loaders.jsonl"
LOADER_ACTIVITY_FILE = "loader_activity.jsonl"
EVENTS_FILE = "events.jsonl"
FINDINGS_FILE = "findings.json"
"""The run's findings document, written at its end (docs/findings-schema.md)."""
PROFILES_DIR = "profiles"
"""The folder of the torch.profiler traces the probe recorded (trainmedic.probe.profile_window)."""
HTML_FILE = "report.html"
"""The run's HTML report, written at its end unless ``--no-html``."""
LINE_FILES = (
    STEPS_FILE,
    WINDOWS_FILE,
    GPU_FILE,
    HOST_FILE,
    LOADERS_FILE,
    LOADER_ACTIVITY_FILE,
    EVENTS_FILE,
)
# Event kind the writer adds at close when a cap made it drop records.
CAPPED_EVENT = EventKind.RECORD_CAPPED
