"""torchrun under trainmedic, for real: gloo on CPU, 2-4 ranks (slow).

A rank whose data is slower is named as the straggler; a balanced job raises
no straggler finding; a rank that hangs stops the whole group, which restarts
and resumes from its checkpoint; two "nodes" (two trainmedic runs, each
wrapping a torchrun of a two-node rendezvous) merge into one report; the
Prometheus endpoint answers during a run.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).with_name("ddp_train.py")
TRAINMEDIC = [sys.executable, "-m", "trainmedic", "run", "--quiet", "--no-html"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


def _env(**values: object) -> dict[str, str]:
    env = dict(os.environ)
    env.update({k: str(v) for k, v in values.items()})
    env["OMP_NUM_THREADS"] = "1"
    return env


def _run(out: Path, command: list[str], options: tuple[str, ...] = (), timeout: float = 240,
         **env: object) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run(
        [*TRAINMEDIC, "--out", str(out), *options, "--", *command],
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _torchrun(nproc: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={nproc}", str(SCRIPT)]  # fmt: skip


def _findings(out: Path) -> list[dict[str, Any]]:
    return list(json.loads((out / "findings.json").read_text())["findings"])


def _ids(out: Path) -> list[str]:
    return [f["id"] for f in _findings(out)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_slow_data_on_rank_1_names_it_with_the_cause(tmp_path: Path) -> None:
    out = tmp_path / "run"
    torchrun = shutil_which_torchrun()
    done = _run(
        out,
        [torchrun, "--standalone", "--nproc-per-node", "2", str(SCRIPT)],
        DATA_SLOW_RANK=1,
        DATA_SLOW_S=0.03,
        STEPS=70,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    stragglers = [f for f in _findings(out) if f["id"].startswith("distributed.straggler")]
    assert len(stragglers) == 1, _ids(out)
    f = stragglers[0]
    assert f["evidence"]["rank"] == 1
    assert f["category"] == "cpu"  # its loader's stacks are in the transform
    assert f["evidence"]["loader_transform_share"] >= 0.4
    # The others waited about the straggler's extra 30 ms per step in the all-reduce.
    assert 0.015 <= f["evidence"]["others_wait_in_collectives_s"] <= 0.06
    assert f["evidence"]["others_wait_in_backward_s"] >= 0.5 * f["evidence"][
        "others_wait_in_collectives_s"
    ]
    assert "Rank 1" in f["title"]
    timeout = next(f for f in _findings(out) if f["id"] == "distributed.collective_timeout")
    assert timeout["evidence"]["recommended_collective_timeout_s"] >= 300
    assert "ranks" in done.stderr  # the per-rank table of the summary


def shutil_which_torchrun() -> str:
    path = Path(sys.executable).with_name("torchrun")
    if not path.exists():
        pytest.skip("torchrun is not installed next to this Python")
    return str(path)


@pytest.mark.parametrize("nproc", [2, 4])
def test_balanced_job_raises_no_straggler_and_serves_metrics(tmp_path: Path, nproc: int) -> None:
    out = tmp_path / "run"
    port = _free_port()
    proc = subprocess.Popen(
        [*TRAINMEDIC, "--out", str(out), "--prometheus", f"127.0.0.1:{port}", "--",
         *_torchrun(nproc)],
        env=_env(STEPS=60 if nproc == 4 else 150),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    scraped = ""
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    scraped = r.read().decode()
            except OSError:
                scraped = ""
            ranks = set(re.findall(r'trainmedic_steps_total\{[^}]*rank="(\d+)"', scraped))
            if len(ranks) == nproc and "trainmedic_data_wait_ratio{" in scraped:
                break
            time.sleep(0.5)
        _, stderr = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    for name in ("trainmedic_steps_total", "trainmedic_steps_per_second",
                 "trainmedic_samples_per_second", "trainmedic_data_wait_ratio",
                 "trainmedic_step_time_seconds", "trainmedic_attempts_total",
                 "trainmedic_hangs_total", "trainmedic_run_info"):  # fmt: skip
        assert name in scraped, name
    assert set(re.findall(r'trainmedic_steps_total\{[^}]*rank="(\d+)"', scraped)) == {
        str(r) for r in range(nproc)
    }
    ids = _ids(out)
    assert not [i for i in ids if i.startswith("distributed.straggler")], ids
    assert "distributed.collective_timeout" in ids


def test_hung_rank_stops_the_group_which_restarts_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = tmp_path / "result.json"
    done = _run(
        out,
        _torchrun(2),
        ("--timeout-floor", "3", "--backoff", "0"),
        HANG_RANK=1,
        HANG_AT=20,
        STEPS=40,
        CKPT_EVERY=5,
        RESULT=result,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(result.read_text()) == {"start": 20, "end": 40, "attempt": "2"}
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    hangs = [e for e in events if e["kind"] == "hang_detected"]
    assert len(hangs) == 1
    assert hangs[0]["data"]["first_stopped"]["rank"] == 1
    assert hangs[0]["data"]["silence"] == "blocked"
    processes = hangs[0]["data"]["evidence"]["processes"]
    rank0 = [p for p in processes if p.get("rank") == 0 and p["role"] != "worker"]
    assert rank0 and rank0[0]["silence"] == "peer_wait"  # waiting in the all-reduce
    hang = next(f for f in _findings(out) if f["id"] == "failure.hang")
    assert hang["evidence"]["rank"] == 1
    # Stacks of every rank: both training processes are in the faulthandler dump.
    stacks = (out / "attempts" / "1" / "stacks.txt").read_text()
    assert stacks.count("Stack (most recent call first):") >= 2
    assert "group waits on rank 1" in done.stderr


def test_two_nodes_merge_into_one_report(tmp_path: Path) -> None:
    port = _free_port()
    procs = []
    for k in (0, 1):
        command = [*TORCHRUN, "--nnodes=2", f"--node-rank={k}", "--nproc-per-node=1",
                   "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                   "--rdzv-id=two-nodes", str(SCRIPT)]  # fmt: skip
        procs.append(
            subprocess.Popen(
                [*TRAINMEDIC, "--out", str(tmp_path / f"node{k}"), "--", *command],
                env=_env(STEPS=60, DATA_SLOW_RANK=1, DATA_SLOW_S=0.03),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    for p in procs:
        _, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
    report = subprocess.run(
        [sys.executable, "-m", "trainmedic", "report", str(tmp_path / "node0"),
         str(tmp_path / "node1"), "--json", str(tmp_path / "merged.json")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    document = json.loads((tmp_path / "merged.json").read_text())
    nodes = document["context"]["nodes"]
    assert [n["ranks"] for n in nodes] == [[0], [1]]
    # One machine, one clock: the aligned offset must come out near zero.
    assert abs(nodes[1]["clock_offset_s"]) < 0.05
    assert nodes[1]["clock_method"] == "lockstep steps"
    straggler = [f for f in document["findings"] if f["id"] == "distributed.straggler.data"]
    assert straggler and straggler[0]["evidence"]["rank"] == 1
    assert straggler[0]["evidence"]["node"] != nodes[0]["hostname"]
    assert "clocks aligned" in report.stdout
