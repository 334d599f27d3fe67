"""What the pause and hang suites share: the scenario script under ``trainmedic run``,
a local HTTP server that answers slowly (or never), and the job's own timestamps."""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from resilience_helpers import SCRIPTS, Run, run_trainmedic

FLOOR_S = 5.0
SUITE_OPTIONS = ["--timeout-floor", str(FLOOR_S), "--grace", "2"]


def silences(state: Path, scenario: str, *args: object) -> list[str]:
    """The command line of the scenario script."""
    return [
        sys.executable,
        str(SCRIPTS / "silences.py"),
        "--state",
        str(state),
        "--scenario",
        scenario,
        *(str(a) for a in args),
    ]


def run_scenario(tmp_path: Path, scenario: str, *args: object, timeout: float = 300) -> Run:
    state = tmp_path / "state"
    return run_trainmedic(
        tmp_path, SUITE_OPTIONS, silences(state, scenario, *args), timeout=timeout
    )


def events(run: Run) -> list[dict[str, Any]]:
    """The script's own events, in order."""
    lines = (run.state / "events").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def first(run: Run, name: str) -> float:
    return next(e["t"] for e in events(run) if e["event"] == name)


def record(run: Run, kind: str) -> list[dict[str, Any]]:
    """Events of the run record of one kind."""
    lines = (run.run_dir / "events.jsonl").read_text().splitlines()
    return [e for e in (json.loads(line) for line in lines if line.strip()) if e["kind"] == kind]


def train_step_ends(run: Run) -> list[float]:
    """End times of the train steps the run record holds (the job's clock)."""
    lines = (run.run_dir / "steps.jsonl").read_text().splitlines()
    steps = [json.loads(line) for line in lines if line.strip()]
    return sorted(s["t"] for s in steps if s.get("ph", "train") == "train")


def longest_gap(ends: list[float], start: float, end: float) -> float:
    """The longest time without a train step between ``start`` and ``end``."""
    inside = [start, *(t for t in ends if start < t < end), end]
    return max(b - a for a, b in itertools.pairwise(inside))


class _Slow(BaseHTTPRequestHandler):
    delay_s = 0.7
    release = threading.Event()

    def do_GET(self) -> None:
        if self.path.startswith("/never/"):
            self.release.wait(900)  # a data store that accepted the request and went silent
            return
        time.sleep(self.delay_s)
        body = bytes(range(256)) * 16
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return None


@contextmanager
def slow_server() -> Iterator[str]:
    """``http://127.0.0.1:PORT``: ``/slow/<i>`` answers after 0.7 s, ``/never/<i>`` never."""
    _Slow.release = threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Slow)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        _Slow.release.set()
        server.shutdown()
        server.server_close()
