"""Whether a job watched from outside is stuck, and where.

When one stack holds :data:`STUCK_SHARE` of every training thread's samples
and none was seen passing through training code outside it (:func:`moved`),
each process is classified as a silence by the watchdog's own rules
(:mod:`trainmedic.resilience.silence`: blocked on a lock, waiting on a peer
or a data source, spinning in place, or working through a long call), from
py-spy's stack and ``/proc``'s counters; a hang is ``failure.hang``, naming
the line where the culprit stands.
"""

from __future__ import annotations

import linecache
import re
import sys
from collections.abc import Sequence
from typing import Any

from trainmedic.attach.observe import Observation, ProcessUse
from trainmedic.attach.parts import MIN_SAMPLES, TRAINING_PARTS, TrainingThread, part_of
from trainmedic.attach.spy import Frame, Stack, ThreadSamples
from trainmedic.attach.states import calls
from trainmedic.findings.model import Category, Finding, Severity
from trainmedic.resilience.errorfile import is_user_code
from trainmedic.resilience.places import Place
from trainmedic.resilience.silence import classify_job
from trainmedic.resilience.silence_evidence import KernelView, ProcessWindow, StackView

STUCK_SHARE = 0.9
"""Share of the training thread's samples in one stack from which it may be stuck."""
MOVED_SAMPLES = 1
"""Samples in training code elsewhere than the thread's usual stack (not a part of it) from
which it is moving: a loop that sleeps 97 % of each step still passes through its forward
and backward, which a hung thread never does. A torn read leaves a stack short, a part of
the usual one, and is not counted; so one sample elsewhere is a step taken. (Three samples
and 1 % were asked before, and a loop asleep 98.5 % of its steps, with about five such
samples expected in 300, showed fewer one time in six and was called hung.)"""


def _module(path: str) -> str:
    p = path.replace("\\", "/")
    for marker in ("site-packages/", "dist-packages/"):
        if marker in p:
            return p.split(marker, 1)[1].removesuffix(".py").replace("/", ".")
    stdlib = f"/lib/python{sys.version_info.major}.{sys.version_info.minor}/"
    if stdlib in p:
        return p.split(stdlib, 1)[1].removesuffix(".py").replace("/", ".")
    return "__main__" if is_user_code(p) else p.rsplit("/", 1)[-1].removesuffix(".py")


def _place(stack: Stack) -> Place:
    frames = stack[:8]
    return Place(
        frames=tuple(f"{fr.file}:{fr.line} {fr.function}" for fr in frames),
        modules=tuple(_module(fr.file) for fr in frames),
        calls=calls(frames[0]) if frames else (),
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


def moved(t: TrainingThread) -> int:
    """Samples of ``t`` in training code (:data:`~trainmedic.attach.parts.TRAINING_PARTS`)
    elsewhere than its most frequent stack and not a run of its frames (a torn read):
    steps it was seen taking."""
    top, _ = t.thread.top()
    return sum(
        n for stack, n in t.thread.stacks.items()
        if not _within(stack, top) and part_of(stack) in TRAINING_PARTS
    )  # fmt: skip


def _within(stack: Stack, top: Stack) -> bool:
    """Whether ``stack`` is ``top`` or a run of consecutive frames of it."""
    n = len(stack)
    return any(top[i : i + n] == stack for i in range(len(top) - n + 1))


def stuck(obs: Observation, threads: Sequence[TrainingThread]) -> Finding | None:
    """``failure.hang`` when every training thread sat in one stack, was not seen moving
    through training code (:data:`MOVED_SAMPLES`), and the watchdog's rules say the job is
    silent for a reason that is a hang."""
    if not threads or any(t.samples < MIN_SAMPLES for t in threads):
        return None
    if any(t.thread.top()[1] / t.samples < STUCK_SHARE for t in threads):
        return None
    if any(moved(t) >= MOVED_SAMPLES for t in threads):
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
    lead = next(
        (t for t in threads if culprit is not None and t.process.pid == culprit.pid), threads[0]
    )
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
    holder = lock_holder(obs, lead, top) if job.silence.value == "blocked" else None
    if holder is not None:
        evidence["holder"] = holder
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
            + (
                f"; {holder['lock']} is held by {holder['who']} since {holder['at']}"
                if holder is not None
                else ""
            )
        ),
        evidence=evidence,
        fix=_holder_fix(holder)
        if holder is not None
        else fixes.get(job.silence.value, fixes["blocked"]),
        impact=1.0,
        subject=f"pid {lead.process.pid}",
    )


def _holder_fix(holder: dict[str, Any]) -> str:
    if holder["self"]:
        return (
            f"The thread waits for {holder['lock']}, which it took itself at {holder['at']}: "
            "release it first, or make it a threading.RLock if taking it again is meant."
        )
    return (
        f"{holder['who']} holds {holder['lock']} (taken at {holder['at']}) and does not let "
        "go: see where it stands (trainmedic attach PID --dump DIR), take locks in one "
        "order everywhere, and give acquire() a timeout."
    )


# --- who holds the lock --------------------------------------------------------------------

_LOOKBACK_LINES = 200
"""Lines above a frame's line searched for where it took the lock."""


def _lock_name(frame: Frame) -> str | None:
    """The lock a frame waits to take: ``lock`` of ``lock.acquire()`` or ``with lock:``."""
    parts = calls(frame)
    if len(parts) >= 2 and parts[-1] == "acquire":
        return ".".join(parts[:-1])
    text = linecache.getline(frame.file, frame.line or 0).strip() if frame.line else ""
    m = re.match(r"^(?:async\s+)?with\s+([\w.]+)\s*(?:as\s+\w+\s*)?:", text)
    return m.group(1) if m else None


def _took_at(frame: Frame, name: str, before: bool) -> int | None:
    """The line of the frame's own function where it took ``name`` and still holds it
    at its current line (``before``: a take on that line itself does not count), read
    from the source; ``None`` when not.

    A ``lock.acquire()`` holds for the lines after it in its block (every line between
    indented at least as deep), unless a ``release()`` of it comes between; a ``with
    lock:`` for the lines indented under it."""
    if not frame.line or not frame.file:
        return None
    here = linecache.getline(frame.file, frame.line)
    if not here.strip():
        return None
    take = re.compile(rf"(?:^|[^\w.])(?:with\s+{re.escape(name)}\b|{re.escape(name)}\.acquire\()")
    release = re.compile(rf"(?:^|[^\w.]){re.escape(name)}\.release\(")
    lowest = len(here) - len(here.lstrip())  # the least indent from the take to here
    released = False
    for line in range(frame.line, max(0, frame.line - _LOOKBACK_LINES), -1):
        text = linecache.getline(frame.file, line)
        stripped = text.lstrip()
        if not stripped or stripped.startswith("#"):
            continue
        indent = len(text) - len(stripped)
        if take.search(text) and not (before and line == frame.line):
            is_with = stripped.startswith(("with ", "async with "))
            holds = lowest > indent if is_with else lowest >= indent and line != frame.line
            if holds and not released:
                return line
        if release.search(text) and line != frame.line:
            released = True
        if stripped.startswith(("def ", "async def ")) and indent < lowest:
            return None
        if line != frame.line:
            lowest = min(lowest, indent)
    return None


def lock_holder(obs: Observation, lead: TrainingThread, top: Stack) -> dict[str, Any] | None:
    """Who holds the lock the stuck thread waits for, where the stacks and the source
    show it: the thread itself (it took the lock above, a ``Lock`` taken twice), or
    another thread of the process standing inside a ``with lock:`` or after a
    ``lock.acquire()`` of the same name."""
    if not top:
        return None
    name = _lock_name(top[0])
    if name is None:
        return None
    candidates: list[tuple[ThreadSamples, bool]] = [(lead.thread, True)]
    candidates += [
        (ts, False)
        for (pid, tid), ts in obs.sampling.threads.items()
        if pid == lead.process.pid and tid != lead.thread.tid
    ]
    for ts, own in candidates:
        stack = top if own else ts.top()[0]
        for i, frame in enumerate(stack):
            line = _took_at(frame, name, before=own and i == 0)
            if line is None:
                continue
            who = "the waiting thread itself" if own else f"thread {ts.tid} ({ts.name})"
            return {
                "lock": name,
                "who": who,
                "tid": ts.tid,
                "thread": ts.name,
                "at": f"{frame.file.rsplit('/', 1)[-1]}:{line}",
                "self": own,
            }
    return None
