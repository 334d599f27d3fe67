"""Findings about a job observed from outside (``trainmedic attach``): where its training
thread's time goes, why it waits for data, and whether it is stuck.

The training thread of each training process is the thread whose samples
fall most in training code (DataLoader, forward, backward, optimizer); each
of its samples is put in one part by the frames it holds (:func:`part_of`):

* ``data_in_process``: inside the DataLoader's fetch in this thread - the
  Dataset and collate run here (``num_workers=0``);
* ``data_wait``: inside the DataLoader, waiting for its workers;
* ``collective`` (``torch.distributed``), ``backward`` (autograd),
  ``optimizer`` (``torch.optim``), ``forward`` (module calls), ``checkpoint``
  (``torch.save``/``load``);
* ``host``: anything else (the loop's own Python, logging, a sleep).

Shares come with their Wilson interval (``share_z`` of the thresholds); a
part is acted on only when its interval's low end clears the threshold, so a
short window says less rather than something wrong.

Input: a data part over ``data_wait_warning_share`` is an ``input.*``
finding of the run's vocabulary: ``input.workers`` when the training thread
loads itself, or its workers use under the cores they could; ``input.cpu``
when the workers fill the usable cores; ``input.io`` / ``input.network``
when the workers wait in file or socket reads.

Stuck: when one stack holds :data:`STUCK_SHARE` of the training thread's
samples, the process is classified as a silence by the watchdog's own rules
(:mod:`trainmedic.resilience.silence`: blocked on a lock, waiting on a peer
or a data source, spinning in place, or working through a long call), from
py-spy's stack and ``/proc``'s counters; a hang is ``failure.hang``.
"""

from __future__ import annotations

import ast
import linecache
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trainmedic.attach.observe import Observation, ProcessUse
from trainmedic.attach.spy import Frame, Stack, ThreadSamples
from trainmedic.attach.tree import JobProcess
from trainmedic.diagnose.sampled import wilson_interval
from trainmedic.diagnose.thresholds import DEFAULT_THRESHOLDS, Thresholds
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.resilience.errorfile import is_user_code
from trainmedic.resilience.places import Place
from trainmedic.resilience.silence import classify_job
from trainmedic.resilience.silence_evidence import KernelView, ProcessWindow, StackView

PARTS = (
    "data_in_process",
    "data_wait",
    "collective",
    "backward",
    "optimizer",
    "forward",
    "checkpoint",
    "host",
)
TRAINING_PARTS = frozenset(PARTS) - {"host"}
STUCK_SHARE = 0.9
"""Share of the training thread's samples in one stack from which it may be stuck."""
MIN_SAMPLES = 20
"""Samples of a training thread below which nothing is said of its time."""
_DATA = "torch/utils/data/"
_FETCH = "torch/utils/data/_utils/fetch.py"
_BY_FILE = (
    ("torch/distributed/", "collective"),
    ("torch/autograd/", "backward"),
    ("torch/optim/", "optimizer"),
    ("torch/nn/modules/module.py", "forward"),
    ("torch/serialization.py", "checkpoint"),
)


def part_of(stack: Stack) -> str:
    """The part of a training step a stack (innermost first) is in (module docstring)."""
    files = [f.file.replace("\\", "/") for f in stack]
    if any(_DATA in f for f in files):
        return "data_in_process" if any(_FETCH in f for f in files) else "data_wait"
    for marker, part in _BY_FILE:
        if any(marker in f for f in files):
            return part
    if any(
        f.endswith("torch/_tensor.py") and fr.function == "backward"
        for f, fr in zip(files, stack, strict=True)
    ):
        return "backward"
    return "host"


@dataclass(frozen=True)
class TrainingThread:
    """The training thread of one training process and where its samples fell."""

    process: JobProcess
    thread: ThreadSamples
    parts: dict[str, int]

    @property
    def samples(self) -> int:
        return self.thread.total


def training_threads(obs: Observation) -> list[TrainingThread]:
    """Each training process's training thread (module docstring)."""
    out: list[TrainingThread] = []
    for p in obs.tree.by_role("training"):
        threads = [t for (pid, _), t in obs.sampling.threads.items() if pid == p.pid]
        if not threads:
            continue
        scored = []
        for t in threads:
            parts: Counter[str] = Counter()
            for stack, n in t.stacks.items():
                parts[part_of(stack)] += n
            training = sum(n for k, n in parts.items() if k in TRAINING_PARTS)
            scored.append((training, t.tid == p.pid, t, parts))
        _, _, thread, parts = max(scored, key=lambda s: (s[0], s[1]))
        out.append(TrainingThread(p, thread, {k: parts.get(k, 0) for k in PARTS}))
    return out


def _share(hits: int, n: int, th: Thresholds) -> dict[str, float]:
    low, high = wilson_interval(hits, n, th.share_z)
    return {"share": round(hits / n, 4) if n else 0.0, "low": round(low, 4), "high": round(high, 4)}


def time_split(t: TrainingThread, th: Thresholds = DEFAULT_THRESHOLDS) -> dict[str, Any]:
    """The training thread's parts as shares with their intervals."""
    return {k: _share(n, t.samples, th) for k, n in t.parts.items() if n}


# --- stuck ---------------------------------------------------------------------------------


def _module(path: str) -> str:
    p = path.replace("\\", "/")
    for marker in ("site-packages/", "dist-packages/"):
        if marker in p:
            return p.split(marker, 1)[1].removesuffix(".py").replace("/", ".")
    stdlib = f"/lib/python{sys.version_info.major}.{sys.version_info.minor}/"
    if stdlib in p:
        return p.split(stdlib, 1)[1].removesuffix(".py").replace("/", ".")
    return "__main__" if is_user_code(p) else p.rsplit("/", 1)[-1].removesuffix(".py")


def _calls(frame: Frame) -> tuple[str, ...]:
    """The dotted name the frame's line calls (``("lock", "acquire")``), read from the
    source: py-spy gives the line, not the call, and a thread parked in a C call shows
    the line that made it."""
    if not frame.line or not frame.file:
        return ()
    text = linecache.getline(frame.file, frame.line).strip()
    if not text:
        return ()
    try:
        tree = ast.parse(text)
    except SyntaxError:
        try:  # the head of a block (``with open(p) as f:``), or the first line of several
            tree = ast.parse(text + "\n    pass" if text.endswith(":") else text + ")")
        except SyntaxError:
            return ()
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    if not calls:
        return ()
    func = calls[0].func
    parts: list[str] = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return tuple(reversed(parts))


def _place(stack: Stack) -> Place:
    frames = stack[:8]
    return Place(
        frames=tuple(f"{fr.file}:{fr.line} {fr.function}" for fr in frames),
        modules=tuple(_module(fr.file) for fr in frames),
        calls=_calls(frames[0]) if frames else (),
    )


def _kernel(use: ProcessUse | None, tid: int | None) -> KernelView | None:
    if use is None:
        return None
    thread = use.threads.get(tid) if tid is not None else None
    return KernelView(
        span_s=use.span_s,
        cpu_s=thread.cpu_s if thread is not None else use.cpu_s,
        run_wait_s=thread.run_wait_s if thread is not None else use.run_wait_s,
        wakeups=use.wakeups,
        io_bytes=use.io_bytes,
        dirtied_bytes=use.dirtied_bytes,
        state=use.state,
        syscall=use.syscall,
        target=use.target,
    )


def _window(obs: Observation, t: TrainingThread) -> ProcessWindow:
    stack, _ = t.thread.top()
    places = {s[0] if s else None for s in t.thread.stacks}
    use = obs.use.get(t.process.pid)
    kernel = _kernel(use, t.thread.tid)
    busy = kernel is not None and (kernel.cpu_share or 0.0) >= 0.5
    view = StackView(
        place=_place(stack),
        fresh=True,
        samples=t.samples,
        gil_busy=t.samples if busy else 0,
        work=0,
        novel=False,
        places=len(places),
    )
    return ProcessWindow(
        pid=t.process.pid,
        role="process",
        rank=t.process.rank,
        probed=True,
        kernel=kernel,
        stack=view,
    )


def stuck(obs: Observation, threads: Sequence[TrainingThread]) -> Finding | None:
    """``failure.hang`` when every training thread sat in one stack and the watchdog's
    rules say the job is silent for a reason that is a hang."""
    if not threads or any(t.samples < MIN_SAMPLES for t in threads):
        return None
    if any(t.thread.top()[1] / t.samples < STUCK_SHARE for t in threads):
        return None
    windows = [_window(obs, t) for t in threads]
    for p in obs.tree.by_role("worker"):
        use = obs.use.get(p.pid)
        samples = [ts for (pid, _), ts in obs.sampling.threads.items() if pid == p.pid]
        main = next((ts for ts in samples if ts.tid == p.pid), None)
        view = None
        if main is not None and main.total:
            top, _ = main.top()
            view = StackView(
                place=_place(top),
                samples=main.total,
                places=len({s[0] if s else None for s in main.stacks}),
            )
        windows.append(
            ProcessWindow(
                pid=p.pid,
                role="worker",
                rank=None,
                probed=True,
                kernel=_kernel(use, p.pid),
                stack=view,
            )
        )
    job = classify_job(windows)
    if not job.silence.hang:
        return None
    culprit = job.culprit
    # Where the culprit stands (a rank the others wait for), else the first training thread.
    lead = next((t for t in threads if culprit is not None and t.process.pid == culprit.pid),
                threads[0])
    top, count = lead.thread.top()
    user = next((fr for fr in top if fr.file and is_user_code(fr.file)), None)
    spot = (user or top[0]).where() if top else "?"
    evidence: dict[str, Any] = {
        "failure_class": "hang",
        "silence": job.silence.value,
        "why": job.why,
        "location": f"{(user or top[0]).file}:{(user or top[0]).line}" if top else None,
        "same_stack_share": round(count / lead.samples, 4),
        "samples": lead.samples,
        "window_s": round(obs.seconds, 1),
        "stack": [fr.where() for fr in top[:12]],
    }
    if culprit is not None:
        evidence["culprit_pid"] = culprit.pid
        if culprit.rank is not None:
            evidence["culprit_rank"] = culprit.rank
    evidence["processes"] = [e.to_data() for e in job.processes]
    fixes = {
        "blocked": (
            "Find who holds what it waits for: the stacks of every thread "
            "(trainmedic attach PID --dump DIR); a lock taken twice, a queue "
            "nobody fills, a join on a thread that never ends."
        ),
        "peer_wait": (
            "A rank waits for the others in a collective: attach to the "
            "launcher to see every rank, and find the one that is elsewhere "
            "(data, a crash, a different code path). Set a timeout on the "
            "process group (init_process_group(timeout=...)) and run the job "
            "under 'trainmedic run' to have hangs restarted."
        ),
        "source_wait": (
            "The data source stopped answering: check the server or the "
            "filesystem it reads; give the reads timeouts."
        ),
        "spinning": (
            "It loops in place waiting for a condition that never comes: fix "
            "the condition, or add a timeout to the loop."
        ),
    }
    return Finding(
        id="failure.hang",
        category=Category.TIMEOUT,
        severity=Severity.ERROR,
        title=(
            f"The job is stuck: for {obs.seconds:.0f} s the training thread stayed at "
            f"{spot} ({job.why})"
        ),
        evidence=evidence,
        fix=fixes.get(job.silence.value, fixes["blocked"]),
        impact=1.0,
        subject=f"pid {lead.process.pid}",
    )


# --- input ---------------------------------------------------------------------------------


def _workers_of(obs: Observation, pid: int) -> list[JobProcess]:
    return [p for p in obs.tree.by_role("worker") if p.ppid == pid]


def input_finding(
    obs: Observation, t: TrainingThread, th: Thresholds = DEFAULT_THRESHOLDS
) -> Finding | None:
    """The training thread waits for data: why, from its workers (module docstring)."""
    n = t.samples
    in_process, waiting = t.parts["data_in_process"], t.parts["data_wait"]
    hits = in_process + waiting
    low, high = wilson_interval(hits, n, th.share_z)
    if n < MIN_SAMPLES or low < th.data_wait_warning_share:
        return None
    share = hits / n
    severity = Severity.ERROR if low >= th.data_wait_error_share else Severity.WARNING
    workers = _workers_of(obs, t.process.pid)
    cores = obs.usable_cores
    spans = [obs.use[w.pid] for w in workers if w.pid in obs.use]
    worker_cores = sum((u.cpu_s or 0.0) for u in spans) / obs.seconds if spans else 0.0
    evidence: dict[str, Any] = {
        "data_share": round(share, 4),
        "data_share_interval": [round(low, 4), round(high, 4)],
        "samples": n,
        "in_training_thread_share": round(in_process / n, 4),
        "workers": len(workers),
        "workers_cpu_cores": round(worker_cores, 3),
        "usable_cores": cores,
        "window_s": round(obs.seconds, 1),
    }
    what = f"The training thread spends {share:.0%} of its time on data"
    if in_process >= waiting or not workers:
        advice = max(1, min(cores - 1, 8))
        return Finding(
            id="input.workers",
            category=Category.FRAMEWORK_CONFIG,
            severity=severity,
            title=f"{what}, loading its batches itself (no DataLoader workers)",
            evidence=evidence,
            fix=(
                f"Load in worker processes: DataLoader(..., num_workers={advice}, "
                "persistent_workers=True, pin_memory=True); 'trainmedic run' of the same "
                "job measures the count it needs."
            ),
            impact=share,
            subject=f"pid {t.process.pid}",
        )
    states = Counter(_wait_kind(obs.use.get(w.pid)) for w in workers)
    blocked, busy = states.most_common(1)[0][0], worker_cores >= 0.8 * max(1, cores - 1)
    if busy:
        return Finding(
            id="input.cpu",
            category=Category.CPU,
            severity=severity,
            title=(
                f"{what}: its {len(workers)} workers use {worker_cores:.1f} of the "
                f"{cores} usable cores"
            ),
            evidence=evidence,
            fix=(
                "The cores are full: make the transforms cheaper (decode at lower "
                "resolution, move augmentations to the GPU), cache decoded samples, or "
                "run on a machine with more cores."
            ),
            impact=share,
            subject=f"pid {t.process.pid}",
        )
    if blocked in ("file", "socket"):
        network = blocked == "socket"
        return Finding(
            id="input.network" if network else "input.io",
            category=Category.NETWORK if network else Category.IO,
            severity=severity,
            title=(
                f"{what}: its {len(workers)} workers wait in "
                f"{'network' if network else 'file'} reads"
            ),
            evidence=evidence,
            fix=(
                "Keep more reads in flight (more workers, or threads inside each), and "
                "cache the data near the GPU"
                if network
                else "Read from faster storage (a local SSD copy), larger files, or more "
                "workers to keep more reads in flight."
            ),
            impact=share,
            subject=f"pid {t.process.pid}",
        )
    more = min(cores - 1, max(len(workers) * 2, len(workers) + 1))
    return Finding(
        id="input.workers",
        category=Category.FRAMEWORK_CONFIG,
        severity=severity,
        title=(
            f"{what}: its {len(workers)} workers use only {worker_cores:.1f} of "
            f"{cores} usable cores"
        ),
        evidence=evidence,
        fix=f"Use more workers: DataLoader(..., num_workers={max(more, len(workers) + 1)}).",
        impact=share,
        subject=f"pid {t.process.pid}",
    )


def _wait_kind(use: ProcessUse | None) -> str:
    if use is None:
        return "unknown"
    target = use.target or ""
    if use.state == "D" or (use.syscall in ("read", "pread64", "readv") and target.startswith("/")):
        return "file"
    if target.startswith("socket") or use.syscall in ("recvfrom", "recvmsg", "connect"):
        return "socket"
    return "cpu" if (use.cpu_s or 0.0) / max(use.span_s, 1e-9) >= 0.5 else "idle"


# --- contention ----------------------------------------------------------------------------


def contention(
    obs: Observation, t: TrainingThread, th: Thresholds = DEFAULT_THRESHOLDS
) -> Finding | None:
    """The training thread waited for a CPU a share of the window (``schedstat``)."""
    use = obs.use.get(t.process.pid)
    thread = use.threads.get(t.thread.tid) if use is not None else None
    if thread is None or obs.seconds <= 0:
        return None
    wait = thread.run_wait_s / obs.seconds
    if wait < th.cpu_wait_warning_share:
        return None
    severity = Severity.ERROR if wait >= th.cpu_wait_error_share else Severity.WARNING
    return Finding(
        id="contention.cpu",
        category=Category.CONTENTION,
        severity=severity,
        title=f"The training thread waits for a CPU {wait:.0%} of its time",
        evidence={
            "train_cpu_wait_share": round(wait, 4),
            "train_cpu_share": round(thread.cpu_s / obs.seconds, 4),
            "usable_cores": obs.usable_cores,
            "window_s": round(obs.seconds, 1),
        },
        fix=(
            "Reserve the cores: stop or move the other processes, pin them away from the "
            "job (taskset -c), or limit them with a container/cgroup (docker run --cpus)."
        ),
        impact=wait,
        subject="host",
    )


def diagnose_attached(obs: Observation, th: Thresholds = DEFAULT_THRESHOLDS) -> list[Finding]:
    """The findings of an attach window, most important first."""
    from trainmedic.findings.model import rank_findings

    threads = training_threads(obs)
    found: list[Finding] = []
    hang = stuck(obs, threads)
    if hang is not None:
        return [hang]
    for t in threads:
        for rule in (input_finding, contention):
            f = rule(obs, t, th)
            if f is not None:
                found.append(f)
    judged = [t for t in threads if t.samples >= MIN_SAMPLES]
    if not found and judged:
        t = judged[0]
        training = sum(n for k, n in t.parts.items() if k in TRAINING_PARTS) / t.samples
        found.append(Finding(
            id="run.healthy", category=Category.MODEL, severity=Severity.INFO,
            title=(f"Nothing found slowing the job in this window: its training thread spent "
                   f"{training:.0%} of its time in training code"),
            evidence={"training_code_share": round(training, 4), "samples": t.samples,
                      "window_s": round(obs.seconds, 1)},
            fix=("Nothing to fix; to go faster: a faster GPU, more GPUs (DDP), or a "
                 "cheaper model."),
            impact=0.0, subject=None,
        ))  # fmt: skip
    return rank_findings(found)
