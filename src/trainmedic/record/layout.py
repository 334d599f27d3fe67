"""The names of a run directory's files: one home for them (docs/run-record.md)."""

from __future__ import annotations

META_FILE = "meta.json"
STEPS_FILE = "steps.jsonl"
WINDOWS_FILE = "windows.jsonl"
GPU_FILE = "gpu.jsonl"
HOST_FILE = "host.jsonl"
LOADERS_FILE = "loaders.jsonl"
LOADER_ACTIVITY_FILE = "loader_activity.jsonl"
EVENTS_FILE = "events.jsonl"
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
CAPPED_EVENT = "record_capped"
