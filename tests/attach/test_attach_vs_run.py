"""``trainmedic attach`` agrees with ``trainmedic run``: each ordinary training script is run
once under ``trainmedic run`` (short: enough steps for its diagnosis) and once started
plainly, without trainmedic (long enough to outlive the window), with ``trainmedic attach
PID`` watching it from outside. Both name the same first finding, and the plain job keeps
running and ends as it would have, with its normal output.

The scripts are the corpus's (``tests/e2e/corpus.py``: the same commands, the finding it
expects, the busy "other users" it starts beside the job) and ``scripts/paused_job.py``,
which stops until SIGUSR1: on a lock, or, under torchrun, rank 1 away while rank 0 waits
in its all-reduce. ``trainmedic run`` declares those hangs after a short fixed timeout and
stops the job; the plain job is woken after the window and trains to its end.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.corpus import BY_NAME, Env, burners, judge

from support.processes import kill_tree
from trainmedic.attach.access import read_problem
from trainmedic.supervise.hang.forensics import find_py_spy

pytest.importorskip("torch")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed"),
]

WATCH_S = 6
PAUSED = Path(__file__).resolve().parent / "scripts" / "paused_job.py"
TORCHRUN = Path(sys.executable).with_name("torchrun")
#: ``trainmedic run`` options for a job that hangs: a short fixed step timeout, no restart.
HANG_OPTIONS = ("--timeout", "3", "--timeout-floor", "1", "--unclear-timeout", "1",
                "--max-restarts", "0", "--grace", "2")  # fmt: skip

Finding = dict[str, Any]
Argv = Callable[[Env], list[str]]


@dataclass(frozen=True)
class Pair:
    """One script, twice.

    Attributes:
        run: the job's argv under ``trainmedic run``.
        plain: the same script's argv started without trainmedic, training long enough
            to outlive the attach window (``paused``: stopping until SIGUSR1).
        run_options: ``trainmedic run``'s own options.
        burners: busy processes of "other users" beside the job, both times.
        paused: the plain job stops (prints ``stuck PID``) until it gets SIGUSR1.
        check: more assertions on the two first findings (run's, attach's).
    """

    name: str
    expected: str
    run: Argv
    plain: Argv
    run_options: tuple[str, ...] = ()
    burners: int = 0
    paused: bool = False
    check: Callable[[Finding, Finding], None] | None = None


def _longer(case: str, steps: int) -> Argv:
    """The corpus case's command with ``--steps`` raised to ``steps``."""

    def argv(env: Env) -> list[str]:
        cmd = BY_NAME[case].command(env)
        cmd[cmd.index("--steps") + 1] = str(steps)
        return cmd

    return argv


def _in_dir(argv: Argv, data: str) -> Argv:
    """``argv`` with the corpus's data directory replaced by ``data`` (a run's data set is
    sized from its steps: the plain, longer job gets one of its own)."""

    def changed(env: Env) -> list[str]:
        return [str(env.tmp / data) if a == str(env.tmp / "data") else a for a in argv(env)]

    return changed


def _corpus(case: str, plain_steps: int, **kw: Any) -> Pair:
    c = BY_NAME[case]
    return Pair(case, c.expected, c.command, _longer(case, plain_steps), burners=c.burners, **kw)


def _paused(mode: str, steps: int) -> Argv:
    def argv(env: Env) -> list[str]:
        job = [str(PAUSED), mode, str(steps)]
        if mode == "gloo":
            port = str(_free_port())
            return [str(TORCHRUN), "--nproc-per-node", "2", "--master-port", port, *job]
        return [env.python, *job]

    return argv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _line(marker: str) -> str:
    lines = PAUSED.read_text().splitlines()
    return f"paused_job.py:{next(i for i, line in enumerate(lines, 1) if marker in line)}"


def _same_lock_line(run: Finding, attach: Finding) -> None:
    where = _line("lock.acquire()  # until SIGUSR1")
    assert run["evidence"]["location"].split(" in ")[0].endswith(where), run["evidence"]
    assert attach["evidence"]["location"].endswith(where), attach["evidence"]
    assert attach["evidence"]["silence"] == "blocked", attach["evidence"]


def _same_culprit_rank(run: Finding, attach: Finding) -> None:
    assert run["evidence"]["first_stopped"]["rank"] == 1, run["evidence"]
    assert attach["evidence"]["culprit_rank"] == 1, attach["evidence"]
    assert attach["evidence"]["location"].endswith(_line("time.sleep(3600)")), attach["evidence"]
    silences = {p.get("rank"): p["silence"] for p in attach["evidence"]["processes"]}
    assert silences == {0: "peer_wait", 1: "blocked"}, silences


PAIRS = (
    # The plain jobs' steps: long enough to outlast the attach window (WATCH_S plus
    # attach's start) on a fast day of this machine, when 1,800 and 230 steps ended first.
    _corpus("cpu-transform-w0", 460),  # augment_no_workers.py: input.workers
    Pair("io-slow-reads-w2", "input.io", BY_NAME["io-slow-reads-w2"].command,
         _in_dir(_longer("io-slow-reads-w2", 75), "plain-data")),  # slow_reads.py
    _corpus("sleep-loop", 280),  # sleep_loop.py: host.sleep
    _corpus("contention-compute", 300),  # mlp_preloaded.py beside burners: contention.cpu
    _corpus("healthy-compute", 4000),  # mlp_preloaded.py: run.healthy
    Pair("hung-on-a-lock", "failure.hang", _paused("lock", 40), _paused("lock", 40),
         HANG_OPTIONS, paused=True, check=_same_lock_line),
    Pair("hung-in-gloo-under-torchrun", "failure.hang", _paused("gloo", 40),
         _paused("gloo", 40), HANG_OPTIONS, paused=True, check=_same_culprit_rank),
)  # fmt: skip


def _run(pair: Pair, env: Env) -> list[Finding]:
    out = env.tmp / "run"
    cmd = [env.python, "-m", "trainmedic", "run", "--quiet", "--no-html", "--out", str(out),
           *pair.run_options, "--", *pair.run(env)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=False,
                          cwd=env.tmp)  # fmt: skip
    assert (out / "findings.json").is_file(), done.stderr[-2000:]
    return list(json.loads((out / "findings.json").read_text())["findings"])


def _first(pair: Pair, findings: list[Finding]) -> Finding:
    """Run's first finding; for a corpus case, the first the corpus counts, and a skip when
    others' load on this machine kept the run from showing the case's cause ("busy")."""
    case = BY_NAME.get(pair.name)
    if case is None:
        return findings[0]
    outcome = judge(case, findings)
    if outcome.result == "busy":
        pytest.skip(f"others' load on this machine: trainmedic run found {outcome.got}")
    assert outcome.first is not None, findings
    return outcome.first


def _attach(pid: int, tmp: Path) -> dict[str, Any]:
    out = tmp / "attach.json"
    done = subprocess.run(
        [sys.executable, "-m", "trainmedic", "attach", str(pid), "--seconds", str(WATCH_S),
         "--json", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr + done.stdout
    doc: dict[str, Any] = json.loads(out.read_text())
    unavailable = doc["context"]["stacks_unavailable"] or ""
    if read_problem(pid) is not None or any(
        m in unavailable for m in ("ermission", "not permitted", "ptrace")
    ):
        # A machine that does not let one process read another's memory (a container
        # without CAP_SYS_PTRACE): attach said why; its judgment cannot be tested here.
        pytest.skip(f"stacks cannot be read here: {unavailable or read_problem(pid)}")
    return doc


@contextlib.contextmanager
def _plain(argv: list[str], tmp: Path) -> Iterator[subprocess.Popen[str]]:
    """The job started without trainmedic, in a session of its own (its stderr to a file)."""
    with (tmp / "plain.err").open("w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, cwd=tmp,
                                start_new_session=True)  # fmt: skip
        try:
            yield proc
        finally:
            if proc.poll() is None:
                kill_tree(proc)  # torchrun's ranks too, in sessions of their own
            proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()


def _readline(proc: subprocess.Popen[str], timeout: float = 90) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"no output from the plain job in {timeout} s"
    return proc.stdout.readline().strip()


def _describe(f: Finding) -> str:
    return f"{f['id']} ({f['severity']}): {f['title']}"


@pytest.mark.parametrize("pair", PAIRS, ids=[p.name for p in PAIRS])
def test_attach_names_what_run_names_and_the_job_ends_unharmed(pair: Pair, tmp_path: Path) -> None:
    if "torchrun" in pair.name and not TORCHRUN.exists():
        pytest.skip("torchrun is not beside this interpreter")
    env = Env(python=sys.executable, tmp=tmp_path)
    plain = pair.plain(env)
    with burners(pair.burners):
        t0 = time.monotonic()
        run_first = _first(pair, _run(pair, env))
        ran = time.monotonic() - t0
        with _plain(plain, tmp_path) as job:
            first_lines = [_readline(job)]
            if pair.paused:  # training ("ready"), then stopped ("stuck PID")
                first_lines.append(_readline(job))
                assert sorted(line.split()[0] for line in first_lines) == ["ready", "stuck"]
            started = time.monotonic()
            doc = _attach(job.pid, tmp_path)
            attach_first = doc["findings"][0]
            assert time.monotonic() - started < WATCH_S + 30
            assert job.poll() is None, "the plain job ended before the window did"
            if pair.paused:
                stuck = next(int(line.split()[1]) for line in first_lines if line[:5] == "stuck")
                os.kill(stuck, signal.SIGUSR1)
            watched = time.monotonic()
            out, _ = job.communicate(timeout=120)
            code = job.returncode
            after = time.monotonic() - watched
    errors = (tmp_path / "plain.err").read_text()
    print(f"\n{pair.name}\n  run:    {_describe(run_first)}\n  attach: {_describe(attach_first)}"
          f"\n  attach evidence: {json.dumps(attach_first['evidence'])[:600]}"
          f"\n  run: {ran:.1f} s; the plain job ended {after:.1f} s after the window")  # fmt: skip

    # The plain job went on and ended as it would have: exit 0, its own output to the end.
    assert code == 0, f"exit {code}; stdout {out[-500:]!r}; stderr {errors[-2000:]}"
    assert "Traceback" not in errors, errors[-2000:]
    lines = [*first_lines, *out.splitlines()]
    if pair.paused:
        ranks = 2 if "gloo" in pair.name else 1
        assert lines.count(f"done {plain[-1]}") == ranks, lines
    else:
        steps = [int(m.group(1)) for line in lines if (m := re.match(r"step (\d+) loss ", line))]
        every = steps[0]
        want = int(plain[plain.index("--steps") + 1])
        assert steps == list(range(every, want + 1, every)), lines
    # Both name the same cause first.
    assert (run_first["id"], attach_first["id"]) == (pair.expected, pair.expected), (
        _describe(run_first), _describe(attach_first), attach_first["evidence"],
    )  # fmt: skip
    if pair.check is not None:
        pair.check(run_first, attach_first)
