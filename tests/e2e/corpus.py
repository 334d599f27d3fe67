"""The validation corpus: real training scripts, each slow for one known reason, run under
``trainmedic run`` on CPU, with the finding that must come first.

Used by ``tests/e2e/test_corpus.py`` (one slow test per case) and by
``benchmarks/diagnosis_corpus.py`` (runs them all and prints the confusion
table of docs/diagnosis.md). Every script in ``scripts/`` is an ordinary
PyTorch script that knows nothing about trainmedic; the slowness is real:
uncached disk reads, an HTTP server with latency or a bandwidth cap on
127.0.0.1, a sample store in a process of its own answering after 30 ms,
CPU transforms, other processes burning the cores, sleeping, logging,
converting tensors, checkpointing and Python bookkeeping in the loop, batches
made by thread pools, prefetch threads, producer processes and event loops,
sub-millisecond steps of a run that lasts a second, launch scripts that
replace ``PYTHONPATH``.

**A shared machine.** Other people's processes are real, and trainmedic
reports the CPU they take (``contention.*`` with the run-queue delay it
measured). Such a finding is skipped when the case is not about contention,
after checking that its evidence shows others' CPU; when it takes the input
rule's place (``input.contention``: the loader was starved), or others took
the spare core a case's own cause needs (``input.cpu`` "the cores are full"
where a core would be spare without them), or the case's own finding is
missing while others' load cost the job a quarter of its time or more (a
contention error), the case cannot show its own cause on this machine and its
outcome is ``busy``, not a pass.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
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
#: others' CPU from which a measured run-queue wait of a quarter of the training
#: thread's time (a contention error) is the machine's: on a job that fills its
#: cores, a third of a core of others' work is enough to make it wait that long.
OTHERS_MIN_CORES_MEASURED_ERROR = 0.25
#: the evidence key of a finding whose parts disagree (trainmedic.diagnose.consistency).
CONSISTENCY_PROBLEMS = "consistency_problems"

Finding = dict[str, Any]


@dataclass
class Env:
    """What a case's command may refer to: the interpreter, a scratch directory, servers
    (``store``: ``HOST:PORT`` of the sample store, a process of its own answering after
    30 ms; ``quick_store``: the same answering at once; ``computing_store``: the same
    computing 20 ms of Python for each answer; ``shm_store`` / ``shm_computing_store``:
    the first and the last on a Unix socket, answering through shared memory)."""

    python: str
    tmp: Path
    latency_url: str = ""
    throttled_url: str = ""
    store: str = ""
    quick_store: str = ""
    computing_store: str = ""
    shm_store: str = ""
    shm_computing_store: str = ""

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
        severities: what the first finding's severity may be (a case that cannot be
            settled expects ``info``).
    """

    name: str
    kind: str
    command: Callable[[Env], list[str]]
    expected: str
    category: str
    burners: int = 0
    check: Callable[[Finding], None] | None = None
    also: tuple[str, ...] = ()
    severities: tuple[str, ...] = ("warning", "error")


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
    run_dir: Path | None = None

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


def _handoff_in_flight(f: Finding) -> None:
    """Latency-bound fetching by other threads or processes: requests in flight sized by
    Little's law, in threads or asyncio, no DataLoader settings, a speed-up that follows."""
    ev = f["evidence"]
    assert ev["helper_observations"] >= 20 and ev["latency_bound"] is True, ev
    needed = ev["samples_in_flight_needed"]
    assert needed > ev["samples_in_flight_now"] and needed > USABLE_CORES - 1, ev
    procs = round(ev["helper_processes_seen"])
    advised = (
        ev.get("recommended_threads")
        or ev.get("recommended_concurrent_requests")
        or ev.get("recommended_threads_per_process", 0) * procs
    )
    assert advised >= needed, ev
    assert "ThreadPoolExecutor" in f["fix"] or "asyncio" in f["fix"], f["fix"]
    assert "num_workers" not in f["fix"] and "usable cores" not in f["fix"], f["fix"]
    whole = 1 / (1 - f["impact"])
    assert 1.5 < ev["predicted_speedup"] <= 1.25 * whole + 0.05, (ev, whole)


def _processes_for_python(f: Finding) -> None:
    """Threads computing in Python: processes, not more threads, and never "network"."""
    ev = f["evidence"]
    assert ev["helper_resource"] == "cpu" and ev["helper_observations"] >= 20, ev
    assert "ProcessPoolExecutor" in f["fix"] and "interpreter lock" in f["fix"], f["fix"]


def _more_producers(f: Finding) -> None:
    """Producer processes computing, a core spare: more of them."""
    ev = f["evidence"]
    assert ev["helper_resource"] == "cpu" and ev["helpers"] == "processes", ev
    assert ev["recommended_processes"] > round(ev["helper_processes_seen"]), ev


def _short_steps_python(f: Finding) -> None:
    """Sub-millisecond steps: enough samples taken to decide, and no DataLoader advice."""
    ev = f["evidence"]
    assert ev["outside_stack_samples"] >= 20 and ev["step_time_median_s"] < 0.001, ev
    assert "larger batch" in f["fix"], f["fix"]
    _no_worker_advice(f)


def _says_what_settles_it(f: Finding) -> None:
    ev = f["evidence"]
    assert ev["settled"] is False and ev["outside_stack_samples"] < 20, ev
    assert "settles it" in f["fix"], f["fix"]


def _handoff(e: Env, via: str, work: str, *args: str, store: str | None = None) -> list[str]:
    return [e.python, e.script("handoff_loop.py"), "--via", via, "--work", work, "--store",
            store or e.store, "--data-dir", str(e.tmp / "handoff-data"), *args]  # fmt: skip


def _server_computes(f: Finding) -> None:
    """A local data server computing each answer: named, its CPU measured, and the fix is
    CPU for it - not more requests in flight, not DataLoader settings."""
    ev = f["evidence"]
    assert ev["server_observations"] >= 20 and ev["server_resource"] == "cpu", ev
    assert "sample_store.py" in ev["data_server"] and f"pid {ev['data_server_pid']}" in f["fix"]
    assert ev["server_threads_on_cpu"] >= 0.5, ev
    assert "samples in flight" not in f["fix"] and "ThreadPoolExecutor" not in f["fix"]
    _no_worker_advice(f)


def _server_waits(f: Finding) -> None:
    """The fooling twin: the same local server sleeping through each answer is latency."""
    _handoff_in_flight(f)
    ev = f["evidence"]
    assert ev.get("server_resource") == "network" and "sample_store.py" in ev["data_server"], ev


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
    # Work handed to other threads or processes by a loop without a DataLoader: its own
    # stack shows only the wait; the cause is what they do. Each shape beside a variant
    # built to fool the rule: the same hand-off computing (not the network), reading
    # files, or waiting on a store that answers at once.
    Case("pool-store", "handoff", lambda e: _handoff(e, "pool", "store", "--steps", "30"),
         "input.network", "network", check=_server_waits),
    # The store on this machine computing each answer instead of waiting: its CPU.
    Case("pool-computing-store", "handoff", lambda e: _handoff(
        e, "pool", "store", "--steps", "20", store=e.computing_store), "input.server_cpu",
        "cpu", check=_server_computes),
    Case("pool-compute", "handoff", lambda e: _handoff(
        e, "pool", "compute", "--steps", "60", "--batch-size", "8"),
        "input.gil", "framework_config", check=_processes_for_python),
    Case("thread-store", "handoff", lambda e: _handoff(
        e, "thread", "store", "--steps", "20", "--batch-size", "8"),
        "input.network", "network", check=_server_waits),
    Case("thread-files", "handoff", lambda e: _handoff(
        e, "thread", "files", "--steps", "40", "--batch-size", "32"), "input.io", "io"),
    Case("processes-store", "handoff", lambda e: _handoff(
        e, "processes", "store", "--steps", "20", "--batch-size", "8"),
        "input.network", "network", check=_server_waits),
    Case("processes-computing-store", "handoff", lambda e: _handoff(
        e, "processes", "store", "--steps", "15", "--batch-size", "8",
        store=e.computing_store), "input.server_cpu", "cpu", check=_server_computes),
    # 150 steps: at 60 a fast machine ran the steady steps in a quarter of a second and
    # the loop's waits got 3 stack samples (CI); here 60 steps take 0.6 s and get 67.
    # One torch thread: with torch's default of one per core, the producer holding a
    # core makes each op wait for its thread team (the loss call took 1.4 ms instead
    # of 0.03, the forward 1.2 instead of 0.2), a second cause (cpu.oversubscribed,
    # its time in the ops read as the loop's own) beside the one this case is about.
    Case("processes-compute", "handoff", lambda e: ["env", "OMP_NUM_THREADS=1", *_handoff(
        e, "processes", "compute", "--steps", "150", "--batch-size", "8", "--producers", "1")],
        "input.workers", "framework_config", check=_more_producers),
    Case("asyncio-store", "handoff", lambda e: _handoff(
        e, "asyncio", "store", "--steps", "20", "--batch-size", "8"),
        "input.network", "network", check=_server_waits),
    # 5000 steps (about 37 s): the rule needs the helper seen working 20 times, and
    # most samples of this wait find it already answered (the loop hands each batch
    # over after under 5 ms of Python), leaving the helpers unlooked at; at 1500 steps
    # (11 s) the count ran from 14 to 30, one run in five under 20, and 2500 still fell
    # short once on CI.
    Case("asyncio-compute", "handoff", lambda e: _handoff(
        e, "asyncio", "compute", "--steps", "5000", "--batch-size", "8"),
        "input.gil", "framework_config", check=_processes_for_python),
    Case("direct-store", "handoff", lambda e: _handoff(
        e, "direct", "store", "--steps", "20", "--batch-size", "8"),
        "input.network", "network", check=_in_flight_beyond_cores),
    # A data server handing samples over in shared memory, on a Unix socket.
    Case("pool-shm-computing-store", "handoff", lambda e: _handoff(
        e, "pool", "store", "--steps", "20", store=e.shm_computing_store), "input.server_cpu",
        "cpu", check=_server_computes),
    Case("thread-shm-store", "handoff", lambda e: _handoff(
        e, "thread", "store", "--steps", "20", "--batch-size", "8", store=e.shm_store),
        "input.network", "network", check=_server_waits),
    Case("direct-computing-store", "handoff", lambda e: _handoff(
        e, "direct", "store", "--steps", "15", "--batch-size", "8", store=e.computing_store),
        "input.server_cpu", "cpu", check=_server_computes),
    Case("direct-quick-store", "handoff", lambda e: _handoff(
        e, "direct", "store", "--steps", "40", "--batch-size", "4", "--hidden", "1536",
        "--layers", "3", store=e.quick_store), "run.healthy", "cpu"),
    # Short runs of tiny steps (pytorch/examples' regression): sampled enough to decide;
    # too short to sample, information that says what would settle it - never an error.
    # The first fits to 3e-4 (~1250 steps, a quarter of a second): at the example's own
    # 1e-3 (~285 steps, 50 ms) the samples taken between steps ranged 18-47 with the
    # machine's speed, astride the 20 needed, so the case did not say one thing.
    Case("poly-regression", "short run", lambda e: [
        e.python, e.script("poly_regression.py"), "--tolerance", "3e-4"], "host.python", "cpu",
        check=_short_steps_python),
    Case("poly-regression-40-steps", "short run", lambda e: [
        e.python, e.script("poly_regression.py"), "--max-steps", "40"], "host.unexplained",
        "framework_config", check=_says_what_settles_it, severities=("info",)),
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
def sample_store(
    latency_s: float, lifetime_s: float = 600.0, cpu_s: float = 0.0, shm: Path | None = None
) -> Iterator[str]:
    """``scripts/sample_store.py`` in a process of its own; yields its ``HOST:PORT`` (with
    ``shm``, a Unix socket path: ``shm:PATH``, answering through shared memory). It ends
    when its standard input closes (here, or if this process dies) and after
    ``lifetime_s`` whatever happens."""
    where = ["--shm", str(shm)] if shm is not None else []
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPTS / "sample_store.py"), "--latency-ms",
         str(latency_s * 1000), "--cpu-ms", str(cpu_s * 1000), "--lifetime-s", str(lifetime_s),
         *where],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], 30.0)
        line = proc.stdout.readline() if ready else ""
        if not line.startswith(("port ", "path ")):
            raise RuntimeError(f"the sample store did not start: {line!r}")
        kind, value = line.split(maxsplit=1)
        yield f"shm:{value.strip()}" if kind == "path" else f"127.0.0.1:{int(value)}"
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextlib.contextmanager
def servers(tmp: Path, python: str = sys.executable) -> Iterator[Env]:
    """The environment every case may use: HTTP with 40 ms latency, 256 KiB samples at
    8 MiB/s, the sample store answering after 30 ms, at once, and after computing 20 ms,
    and the first and last of those on a Unix socket with shared memory."""
    with (
        data_server(0.040) as latency,
        data_server(0.0, 8 * 2**20, 256 * 1024) as throttled,
        sample_store(0.030) as store,
        sample_store(0.0) as quick,
        sample_store(0.0, cpu_s=0.020) as computing,
        sample_store(0.030, shm=tmp / "shm-store.sock") as shm_store,
        sample_store(0.0, cpu_s=0.020, shm=tmp / "shm-computing.sock") as shm_computing,
    ):
        yield Env(python=python, tmp=tmp, latency_url=latency, throttled_url=throttled,
                  store=store, quick_store=quick, computing_store=computing,
                  shm_store=shm_store, shm_computing_store=shm_computing)  # fmt: skip


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
    outcome.run_dir = run_dir
    return outcome


def judge(case: Case, findings: Sequence[Finding]) -> Outcome:
    """``match`` when the first counted finding is the expected one (and its checks pass)."""
    counted = [f for f in findings if not _machine_contention(case, f)]
    first = counted[0] if counted else None
    others = first["evidence"].get("others_cpu_cores", 0.0) if first is not None else 0.0
    if (
        first is not None
        and first["id"] == "input.contention"
        and case.kind != "contention"
        and others >= OTHERS_MIN_CORES
    ):
        return Outcome(case, "busy", first, list(findings))
    if (
        first is not None
        and first["id"] == "input.cpu"
        and case.category == "framework_config"
        and others >= OTHERS_MIN_CORES
    ):
        # The spare core the case's cause needs is the one others took.
        return Outcome(case, "busy", first, list(findings))
    if (
        first is not None
        and first["id"] == "cpu.oversubscribed"
        and case.category == "framework_config"
        and any(f["id"] == case.expected for f in counted)
    ):
        # The case's fix is more parallel workers on a spare core; the job itself (its
        # helpers, the test's own data server beside it) already kept every core of this
        # machine busy, so the run shows that, not the case.
        return Outcome(case, "busy", first, list(findings))
    if case.expected == "run.healthy":
        problems = [f for f in counted if f["severity"] != "info"]
        ok = not problems
        return Outcome(case, "match" if ok else "mismatch", problems[0] if problems else first,
                       list(findings))  # fmt: skip
    if any(CONSISTENCY_PROBLEMS in f["evidence"] for f in findings):
        # A finding whose parts disagree is never a right answer.
        return Outcome(case, "mismatch", first, list(findings))
    ok = (
        first is not None
        and first["id"] in (case.expected, *case.also)
        and first["category"] == case.category
        and first["severity"] in case.severities
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
    if measured is None:
        return False
    if f["severity"] == "error" and "train_cpu_wait_share" in ev:
        return others >= OTHERS_MIN_CORES_MEASURED_ERROR
    return others >= OTHERS_MIN_CORES


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
