"""The validation corpus: real training scripts, each slow for one known reason, run under
``trainmedic run`` on CPU, with the finding that must come first.

Used by ``tests/e2e/test_corpus.py`` (one slow test per case) and by
``benchmarks/diagnosis_corpus.py`` (runs them all and prints the confusion
table of docs/diagnosis.md). Every script in ``scripts/`` is an ordinary
PyTorch script that knows nothing about trainmedic; the slowness is real:
uncached disk reads, an HTTP server with latency or a bandwidth cap on
127.0.0.1, CPU transforms, other processes burning the cores, sleeping,
logging, converting tensors, checkpointing and Python bookkeeping in the
loop, launch scripts that replace ``PYTHONPATH``.

**A shared machine.** Other people's processes are real, and trainmedic
reports the CPU they take (``contention.*`` with the run-queue delay it
measured). Such a finding is skipped when the case is not about contention,
after checking that its evidence shows others' CPU; when it takes the input
rule's place (``input.contention``: the loader was starved), or the case's
own finding is missing while others' load cost the job a quarter of its time
or more (a contention error), the case cannot show its own cause on this
machine and its outcome is ``busy``, not a pass.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent / "scripts"
USABLE_CORES = len(os.sched_getaffinity(0))
#: others' CPU from which a contention finding is the machine's, not the case's.
OTHERS_MIN_CORES = 0.5

Finding = dict[str, Any]


@dataclass
class Env:
    """What a case's command may refer to: the interpreter, a scratch directory, servers."""

    python: str
    tmp: Path
    latency_url: str = ""
    throttled_url: str = ""

    def script(self, name: str) -> str:
        return str(SCRIPTS / name)


@dataclass(frozen=True)
class Case:
    """One corpus case.

    Attributes:
        kind: the class of cause it stands for (data loading, host time, ...).
        command: the job's argv, from the environment.
        expected: the finding that must come first (``run.healthy``: no warning at all).
        category: its category.
        burners: busy processes of "other users" started beside the job.
        check: more assertions on the first finding (raises AssertionError).
        also: other ids that name the same cause (the category must still match).
    """

    name: str
    kind: str
    command: Callable[[Env], list[str]]
    expected: str
    category: str
    burners: int = 0
    check: Callable[[Finding], None] | None = None
    also: tuple[str, ...] = ()


@dataclass
class Outcome:
    """What a case gave: ``match``, ``mismatch`` or ``busy`` (see the module docstring)."""

    case: Case
    result: str
    first: Finding | None
    findings: list[Finding] = field(default_factory=list)
    wall_s: float = 0.0
    supervisor_cpu_share: float | None = None
    stderr: str = ""

    @property
    def got(self) -> str:
        return "-" if self.first is None else f"{self.first['id']} ({self.first['category']})"


# --- checks ---------------------------------------------------------------------------------


def _no_worker_advice(f: Finding) -> None:
    assert "num_workers" not in f["fix"] and "DataLoader(" not in f["fix"], f["fix"]


def _in_flight_beyond_cores(f: Finding) -> None:
    ev = f["evidence"]
    assert ev["samples_in_flight_needed"] > USABLE_CORES, ev
    flight = ev["recommended_num_workers"] * ev["recommended_threads_per_worker"]
    assert flight >= ev["samples_in_flight_needed"], ev
    assert "ThreadPoolExecutor" in f["fix"] and "usable cores" not in f["fix"], f["fix"]
    assert ev["predicted_speedup"] > 1.5, ev


def _sized_from_latency(f: Finding) -> None:
    ev = f["evidence"]
    assert ev["sample_latency_ms"] > 0 and ev["predicted_speedup"] > 1.2, ev
    assert "usable cores" not in f["fix"], f["fix"]


def _build_a_dataloader(f: Finding) -> None:
    assert "num_workers" not in f["evidence"], f["evidence"]  # no DataLoader at all
    assert "Dataset" in f["fix"], f["fix"]


def _measured_wait(f: Finding) -> None:
    assert f["evidence"]["train_cpu_wait_share"] >= 0.05, f["evidence"]


def _blind(f: Finding) -> None:
    ev = f["evidence"]
    assert ev["steps_seen"] == 0 and "-S" in ev["reason"], ev


# --- the cases -------------------------------------------------------------------------------


def _launch(env: Env, body: str) -> list[str]:
    """A launch script, as research code ships it, that sets its own PYTHONPATH."""
    script = env.tmp / "launch.sh"
    script.write_text(f"#!/bin/bash\nset -e\nexport PYTHONPATH={env.tmp}/src\n{body}\n")
    return ["bash", str(script)]


CASES: tuple[Case, ...] = (
    # Data loading: the resource the time goes to.
    Case("io-uncached-w0", "data loading", lambda e: [
        e.python, e.script("uncached_reads.py"), str(e.tmp / "data"), "--steps", "60",
        "--workers", "0", "--files", "128"], "input.io", "io", check=_sized_from_latency),
    Case("io-slow-reads-w2", "data loading", lambda e: [
        e.python, e.script("slow_reads.py"), str(e.tmp / "data"), "--steps", "50",
        "--latency-ms", "8", "--workers", "2"], "input.io", "io", check=_sized_from_latency),
    Case("net-latency-w0", "data loading", lambda e: [
        e.python, e.script("http_loader.py"), e.latency_url, "--steps", "30", "--workers", "0",
        "--batch-size", "8"], "input.network", "network", check=_in_flight_beyond_cores),
    Case("net-latency-w2", "data loading", lambda e: [
        e.python, e.script("http_loader.py"), e.latency_url, "--steps", "50", "--workers", "2",
        "--batch-size", "8"], "input.network", "network", check=_in_flight_beyond_cores),
    Case("net-bandwidth-w2", "data loading", lambda e: [
        e.python, e.script("http_loader.py"), e.throttled_url, "--steps", "40", "--workers",
        "2", "--batch-size", "8"], "input.network", "network"),
    Case("cpu-transform-w0", "data loading", lambda e: [
        e.python, e.script("augment_no_workers.py"), "--steps", "60"],
        "input.workers", "framework_config"),
    Case("cpu-saturated-workers", "data loading", lambda e: [
        e.python, e.script("saturating_workers.py"), "--steps", "60"], "input.cpu", "cpu"),
    Case("manual-batches", "data loading", lambda e: [
        e.python, e.script("manual_batches.py"), "--steps", "150"],
        "input.workers", "framework_config", check=_build_a_dataloader),
    # Host time that is not data loading, in loops without a DataLoader.
    Case("sleep-loop", "host time", lambda e: [
        e.python, e.script("sleep_loop.py"), "--steps", "150"], "host.sleep",
        "framework_config", check=_no_worker_advice),
    Case("logging-loop", "host time", lambda e: [
        e.python, e.script("logging_loop.py"), str(e.tmp / "train.log"), "--steps", "150"],
        "host.log", "framework_config", check=_no_worker_advice),
    Case("sync-loop", "host time", lambda e: [
        e.python, e.script("sync_loop.py"), "--steps", "120"], "host.python", "cpu",
        check=_no_worker_advice),
    Case("checkpoint-loop", "host time", lambda e: [
        e.python, e.script("checkpoint_loop.py"), str(e.tmp / "ckpt"), "--steps", "60"],
        "host.file_write", "io", check=_no_worker_advice),
    Case("python-overhead", "host time", lambda e: [
        e.python, e.script("python_overhead.py"), "--steps", "150"], "host.python", "cpu",
        check=_no_worker_advice),
    # Contention from processes the case starts; the job's own threads.
    Case("contention-compute", "contention", lambda e: [
        e.python, e.script("mlp_preloaded.py"), "--steps", "100"], "contention.cpu",
        "contention", burners=USABLE_CORES, check=_measured_wait),
    # Starved of CPU, the loader may wait less than the slowed step computes: the cause
    # is contention either way (the input rule's or the contention rule's).
    Case("contention-loader", "contention", lambda e: [
        e.python, e.script("augment_no_workers.py"), "--steps", "25"], "input.contention",
        "contention", burners=USABLE_CORES, also=("contention.cpu",)),
    Case("oversubscribed-threads", "contention", lambda e: [
        e.python, e.script("oversubscribed.py"), "--steps", "200", "--threads",
        str(4 * USABLE_CORES)], "cpu.oversubscribed", "cpu", check=_measured_wait),
    # Launch scripts and env wrappers that replace PYTHONPATH.
    Case("launch-export-pythonpath", "launch", lambda e: _launch(
        e, f"{e.python} {e.script('sleep_loop.py')} --steps 150"), "host.sleep",
        "framework_config"),
    Case("launch-env-wrapper", "launch", lambda e: [
        "env", f"PYTHONPATH={e.tmp}", e.python, e.script("slow_reads.py"), str(e.tmp / "data"),
        "--steps", "50", "--latency-ms", "8", "--workers", "2"], "input.io", "io",
        check=_sized_from_latency),
    Case("launch-blind-interpreter", "launch", lambda e: _launch(
        e, f"exec {e.python} -S {e.script('busy_python.py')} --seconds 7"),
        "probe.not_loaded", "framework_config", check=_blind),
    # Healthy: no warning, no error.
    Case("healthy-compute", "healthy", lambda e: [
        e.python, e.script("mlp_preloaded.py"), "--steps", "400"], "run.healthy", "cpu"),
)  # fmt: skip
BY_NAME = {c.name: c for c in CASES}


# --- running a case --------------------------------------------------------------------------


class _Samples(BaseHTTPRequestHandler):
    """A data server far away: ``latency_s`` before each answer, ``bytes_per_s`` while
    sending (0: unlimited)."""

    latency_s = 0.0
    bytes_per_s = 0.0
    body_bytes = 1024

    def do_GET(self) -> None:
        time.sleep(self.latency_s)
        body = bytes(self.body_bytes)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        chunk = 16 * 1024
        for i in range(0, len(body), chunk):
            self.wfile.write(body[i : i + chunk])
            if self.bytes_per_s:
                time.sleep(min(chunk, len(body) - i) / self.bytes_per_s)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def data_server(latency_s: float, bytes_per_s: float = 0.0, body: int = 1024) -> Iterator[str]:
    handler = type(
        "Handler", (_Samples,), {"latency_s": latency_s, "bytes_per_s": bytes_per_s,
                                 "body_bytes": body}
    )  # fmt: skip
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def servers(tmp: Path, python: str = sys.executable) -> Iterator[Env]:
    """The environment every case may use: 40 ms latency, and 256 KiB samples at 8 MiB/s."""
    with data_server(0.040) as latency, data_server(0.0, 8 * 2**20, 256 * 1024) as throttled:
        yield Env(python=python, tmp=tmp, latency_url=latency, throttled_url=throttled)


@contextlib.contextmanager
def burners(n: int) -> Iterator[None]:
    """Other people's work: busy processes, each in a session of its own."""
    procs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
        for _ in range(n)
    ]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def run_case(case: Case, env: Env, timeout: float = 300) -> Outcome:
    """Run ``case`` under ``trainmedic run`` and judge its first finding."""
    run_dir = env.tmp / f"run-{case.name}"
    argv = case.command(env)
    cmd = [env.python, "-m", "trainmedic", "run", "--quiet", "--no-html", "--out",
           str(run_dir), "--", *argv]  # fmt: skip
    t0 = time.monotonic()
    with burners(case.burners):
        got = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                             cwd=env.tmp)  # fmt: skip
    wall = time.monotonic() - t0
    path = run_dir / "findings.json"
    if not path.is_file():
        return Outcome(case, "mismatch", None, wall_s=wall, stderr=got.stderr[-2000:])
    findings = list(json.loads(path.read_text())["findings"])
    outcome = judge(case, findings)
    outcome.wall_s = wall
    outcome.supervisor_cpu_share = _supervisor_share(run_dir)
    outcome.stderr = got.stderr[-2000:]
    return outcome


def judge(case: Case, findings: Sequence[Finding]) -> Outcome:
    """``match`` when the first counted finding is the expected one (and its checks pass)."""
    counted = [f for f in findings if not _machine_contention(case, f)]
    first = counted[0] if counted else None
    if (
        first is not None
        and first["id"] == "input.contention"
        and case.kind != "contention"
        and first["evidence"].get("others_cpu_cores", 0.0) >= OTHERS_MIN_CORES
    ):
        return Outcome(case, "busy", first, list(findings))
    if case.expected == "run.healthy":
        problems = [f for f in counted if f["severity"] != "info"]
        ok = not problems
        return Outcome(case, "match" if ok else "mismatch", problems[0] if problems else first,
                       list(findings))  # fmt: skip
    ok = (
        first is not None
        and first["id"] in (case.expected, *case.also)
        and first["category"] == case.category
        and first["severity"] in ("warning", "error")
    )
    if ok and case.check is not None:
        assert first is not None
        try:
            case.check(first)
        except AssertionError:
            ok = False
    if not ok and any(_machine_contention(case, f) and f["severity"] == "error" for f in findings):
        # Others' load cost the job a quarter of its time or more: the run shows the
        # machine, not the case (the case's cause may not even reach its threshold).
        return Outcome(case, "busy", first, list(findings))
    return Outcome(case, "match" if ok else "mismatch", first, list(findings))


def _machine_contention(case: Case, f: Finding) -> bool:
    """A contention finding about others' load on a shared machine, in a case not about it."""
    if case.kind == "contention" or f["category"] != "contention" or f["id"] == case.expected:
        return False
    if f["id"] == "input.contention":
        return False  # it takes the input rule's place: judged as "busy"
    if f["id"] == "stall.contention":
        return True  # stalls while others' CPU was high, judged per stall
    ev = f["evidence"]
    others = ev.get("others_cpu_cores", 0.0)
    measured = ev.get("train_cpu_wait_share", ev.get("others_cpu_limit_cores"))
    return others >= OTHERS_MIN_CORES and measured is not None


def _supervisor_share(run_dir: Path) -> float | None:
    try:
        lines = (run_dir / "events.jsonl").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        e = json.loads(line)
        if e.get("kind") == "supervisor_usage":
            data = e.get("data", {})
            if data.get("wall_s"):
                return float(data["cpu_s"]) / float(data["wall_s"])
    return None
