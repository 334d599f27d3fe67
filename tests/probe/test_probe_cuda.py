"""The probe's CUDA parts on a real GPU: GPU time from events, allocator statistics,
autocast, whole-step CUDA graph capture, fp16 GradScaler, a second device, compiled
training with CUDA graph trees.

Run by scripts/gpu-check (``-m gpu``); skipped elsewhere.
"""

from __future__ import annotations

import importlib.util
import shutil
import statistics
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from trainmedic.probe import graphs
from trainmedic.probe.cuda import CudaSteps
from trainmedic.probe.detail import WARMUP_STEPS
from trainmedic.probe.parts import Parts
from trainmedic.probe.segments import Segment, StepDraft

from .probed import SCRIPTS, ProbedRun, run_probed

pytestmark = pytest.mark.gpu

PREP_S = 0.02  # cuda_loop.py's host-side batch preparation in "prep" mode


def cuda_loop(tmp_path: Path, *args: object) -> ProbedRun:
    run = run_probed(
        [sys.executable, str(SCRIPTS / "cuda_loop.py"), *(str(a) for a in args)], tmp_path
    )
    assert run.proc.returncode == 0, run.proc.stderr
    assert [e for e in run.events if e.kind == "probe_error"] == []
    return run


def cuda_loop_script(tmp_path: Path, name: str, *args: object) -> ProbedRun:
    run = run_probed(
        [sys.executable, str(SCRIPTS / name), *(str(a) for a in args)], tmp_path, timeout=300
    )
    assert run.proc.returncode == 0, run.proc.stderr
    assert [e for e in run.events if e.kind == "probe_error"] == []
    return run


def test_gpu_time_and_allocator_statistics_are_recorded(tmp_path: Path) -> None:
    run = cuda_loop(tmp_path, 40, "loader", "amp")
    steps = run.steps
    assert len(steps) == 40
    timed = [s for s in steps if s.gpu_time_s is not None]
    assert len(timed) >= 38  # read without syncs: all complete by the end
    assert all(0 < s.gpu_time_s <= s.duration_s * 1.5 for s in timed)  # type: ignore[operator]
    with_alloc = [s for s in steps if s.alloc_peak_bytes is not None]
    assert with_alloc, "allocator statistics were never read"
    assert all(
        s.alloc_peak_bytes > 0 and s.reserved_peak_bytes >= s.alloc_peak_bytes for s in with_alloc
    )  # type: ignore[operator]
    assert all(s.ooms == 0 and s.alloc_retries == 0 for s in with_alloc)
    # Autocast is read by the forward hook: known on the steps it ran on (every
    # step of the warm-up), unknown (None) on short steps without it.
    assert {s.autocast for s in steps[:WARMUP_STEPS]} == {True}
    assert {s.autocast for s in steps} <= {True, None}
    torch_info = [m for m in run.messages if type(m).__name__ == "TorchInfo"]
    assert any(t.cuda_initialized and t.devices for t in torch_info)  # type: ignore[attr-defined]


def test_short_steps_without_the_compute_hooks_still_get_their_gpu_time(tmp_path: Path) -> None:
    """After the warm-up, short loader steps run without the compute hooks on
    most steps (trainmedic.probe.detail): their start event is then recorded
    when the batch arrives, so they keep their GPU time."""
    run = cuda_loop(tmp_path, WARMUP_STEPS + 160, "loader")
    later = run.steps[WARMUP_STEPS + 1 :]
    partial = [s for s in later if s.compute_s is None]
    assert len(partial) >= 100, "the compute hooks were never taken off"
    timed = [s for s in partial if s.gpu_time_s is not None]
    assert len(timed) >= len(partial) - 2
    assert all(0 < s.gpu_time_s <= s.duration_s * 1.5 for s in timed)  # type: ignore[operator]
    full = [s for s in run.steps[2:WARMUP_STEPS] if s.gpu_time_s is not None]
    # Timed from the batch's arrival rather than the first forward call: the
    # same order of GPU time as the steps timed with every hook.
    ratio = statistics.median(s.gpu_time_s for s in timed) / statistics.median(  # type: ignore[type-var]
        s.gpu_time_s for s in full  # type: ignore[misc]
    )
    assert 0.5 < ratio < 2.0


def test_autocast_off_is_reported_off(tmp_path: Path) -> None:
    run = cuda_loop(tmp_path, 10, "loader")
    assert {s.autocast for s in run.steps} == {False}


def test_host_batch_preparation_is_data_wait_when_the_gpu_waits_for_it(tmp_path: Path) -> None:
    run = cuda_loop(tmp_path, 20, "prep")
    later = run.steps[2:]
    # The GPU sat idle while the host prepared each batch.
    assert all(s.data_wait_s >= PREP_S * 0.8 for s in later)


def test_a_sync_on_a_busy_gpu_is_not_data_wait(tmp_path: Path) -> None:
    run = cuda_loop(tmp_path, 30, "sync")
    later = run.steps[5:]
    total = sum(s.duration_s for s in later)
    # loss.item() keeps the host waiting while the GPU works: not waiting for data.
    assert sum(s.data_wait_s for s in later) / total < 0.2
    assert sum(s.gpu_time_s or 0.0 for s in later) / total > 0.6


def test_a_whole_step_graph_capture_is_left_intact_and_replays_are_steps(tmp_path: Path) -> None:
    """The probe must not break ``torch.cuda.graph`` capture of ``optimizer.step()``."""
    argv = [sys.executable, str(SCRIPTS / "cuda_graph_step.py"), 40]
    plain = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=300)
    assert plain.returncode == 0, plain.stderr
    run = cuda_loop_script(tmp_path, "cuda_graph_step.py", 40)
    # An invalidated capture raises in the job; a probe that broke it fails here.
    assert run.proc.stdout.splitlines()[-1] == "replays 40"
    losses = [float(line.split()[1]) for line in run.proc.stdout.splitlines()[:-1]]
    expected = [float(line.split()[1]) for line in plain.stdout.splitlines()[:-1]]
    assert losses == pytest.approx(expected, rel=1e-4)  # the graph computes the same
    train = [s for s in run.steps if s.phase == "train"]
    # 3 warm-up steps, the captured step, then one step per replay.
    assert len(train) == 3 + 1 + 40
    replays = train[4:]
    timed = [s for s in replays if s.gpu_time_s is not None]
    assert len(timed) >= 35
    assert all(0 < s.gpu_time_s <= s.duration_s * 1.5 for s in timed)  # type: ignore[operator]


def test_fp16_grad_scaler_gives_one_step_per_iteration(tmp_path: Path) -> None:
    run = cuda_loop_script(tmp_path, "amp_skips.py", 30, 3, "cuda")
    assert "skipped 10" in run.proc.stdout
    train = [s for s in run.steps if s.phase == "train"]
    assert [s.step for s in train] == list(range(1, 31))
    assert {s.autocast for s in train} == {True}
    (final,) = [e for e in run.events if e.kind == "grad_scaler" and e.data["final"]]
    assert (final.data["skipped"], final.data["scaler_steps"]) == (10, 30)
    assert len([s for s in train if s.gpu_time_s is not None]) >= 27


def test_steps_on_another_device_are_timed_on_that_device(tmp_path: Path) -> None:
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs: the job must compute on one that is not the current device")
    run = cuda_loop_script(tmp_path, "cuda_other_device.py", 60)
    later = run.steps[5:]
    total = sum(s.duration_s for s in later)
    # GPU-bound: timed on device 0's idle stream it would read about 0.
    assert sum(s.gpu_time_s or 0.0 for s in later) / total > 0.5
    # The allocator of the device computing, not of device 0 (where nothing is allocated).
    peak = int(run.proc.stdout.split("peak ")[1].split()[0])
    read = [s.alloc_peak_bytes for s in run.steps if s.alloc_peak_bytes is not None]
    assert read and all(0 < b <= peak for b in read)


def test_on_one_gpu_the_allocator_is_still_read_on_the_optimizers_device() -> None:
    """With one GPU the current device is the job's: the device must still be passed
    (a job that sets another device current later stays read where it computes)."""
    import torch

    asked: list[Any] = []

    class Cuda:
        """torch.cuda, noting the devices memory_stats is asked about."""

        def __getattr__(self, name: str) -> Any:
            return getattr(torch.cuda, name)

        def memory_stats(self, device: Any = None) -> dict[str, Any]:
            asked.append(device)
            return dict(torch.cuda.memory_stats(device))

    allocs: list[Any] = []
    parts = Parts((), (), lambda part, exc, tb: None)
    cuda = CudaSteps(
        SimpleNamespace(cuda=Cuda()), parts["cuda"], lambda d, t, a: allocs.append(a), lambda: None
    )
    probe = SimpleNamespace(
        parts=parts,
        cuda=cuda,
        state=SimpleNamespace(training_ident=threading.get_ident()),
        restore=[],
    )
    assert graphs.install_device_hook(torch, probe, None)  # type: ignore[arg-type]
    try:
        model = torch.nn.Linear(1024, 1024).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        marker = cuda.segment_started()
        model(torch.randn(256, 1024, device="cuda")).sum().backward()
        opt.step()  # the device hook tells the CUDA part: cuda:0
        seg = Segment.of(0.0, compute=1.0, compute_seen=True, start_marker=marker)
        cuda.add(StepDraft(1, "train", "optimizer", 1.0, seg))
        torch.cuda.synchronize()
        cuda.flush()
    finally:
        while probe.restore:
            probe.restore.pop()()
    assert asked == [torch.device("cuda", 0)]
    (alloc,) = allocs
    assert alloc.alloc_peak_bytes >= 1024 * 1024 * 4  # the weights at least


def triton_missing() -> str | None:
    if importlib.util.find_spec("triton") is None:
        return "inductor needs Triton, which is not installed"
    if not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")):
        return "inductor's Triton launcher needs a C compiler, and there is none"
    return None


@pytest.mark.parametrize(
    "how",
    [
        "cudagraphs",
        pytest.param("reduce-overhead", marks=pytest.mark.slow),
    ],
)
def test_a_compiled_step_with_cuda_graph_trees_keeps_its_captures_and_its_steps(
    tmp_path: Path, how: str
) -> None:
    """``optimizer.step()`` inside a region compiled with CUDA graph trees: the probe
    breaks no capture, the job computes what it computes eagerly, and each compiled call
    is a step (ended at its backward call: the compiled optimizer step runs no hook)."""
    if how == "reduce-overhead" and (reason := triton_missing()) is not None:
        pytest.skip(reason)
    steps = 12
    run = cuda_loop_script(tmp_path, "compiled_cuda_graphs.py", steps, how)
    out = dict(line.split(" ", 1) for line in run.proc.stdout.splitlines() if " " in line)
    compiled = [float(v) for v in out["compiled"].split()]
    eager = [float(v) for v in out["eager"].split()]
    assert compiled == pytest.approx(eager, rel=1e-3, abs=1e-5)
    assert int(out["captures"]) >= 1, "CUDA graph trees captured nothing"
    train = [s for s in run.steps if s.phase == "train"]
    # The compiled run comes first: its optimizer leads.
    assert [s.source for s in train[:steps]] == ["optimizer"] + ["backward"] * (steps - 1)
    assert train[steps - 1].step == steps
