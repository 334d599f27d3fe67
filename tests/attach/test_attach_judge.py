"""The attach judge on hand-made observations: what the loading work's stacks name
(``input.io`` from workers in file reads, ``input.gil`` from threads computing), the
loop's own time (``host.sleep``), the job's GPUs, and GPU rules over the readings."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from trainmedic.attach.gpus import GpuWindow, job_gpus
from trainmedic.attach.judge import diagnose_attached
from trainmedic.attach.observe import Observation, ProcessUse, ThreadUse
from trainmedic.attach.spy import Frame, Sampling, Stack, ThreadSamples, run_measured
from trainmedic.attach.tree import JobProcess, JobTree
from trainmedic.gpu.types import GpuProcess, GpuSample

SITE = "/venv/lib/python3.11/site-packages"
LIB = "/usr/lib/python3.11"
TRAIN = (Frame("forward", f"{SITE}/torch/nn/modules/module.py", 1),
         Frame("main", "/t/train.py", 30))  # fmt: skip
WAIT_WORKERS = (Frame("_next_data", f"{SITE}/torch/utils/data/dataloader.py", 1),
                Frame("main", "/t/train.py", 20))  # fmt: skip


def _obs(
    threads: dict[tuple[int, int], dict[Stack, int]],
    workers: tuple[int, ...] = (),
    seconds: float = 10.0,
    gpu: GpuWindow | None = None,
) -> Observation:
    procs = [JobProcess(10, 1, "training", ("python", "train.py"), True, True)]
    procs += [JobProcess(w, 10, "worker", ("python", "train.py"), True, True) for w in workers]
    samples = {
        key: ThreadSamples(key[0], key[1], "MainThread" if key[0] == key[1] else f"t{key[1]}",
                           dict(stacks))
        for key, stacks in threads.items()
    }  # fmt: skip
    use = {
        p.pid: ProcessUse(p.pid, seconds, 0.2 * seconds, 0, 0, 0.0, 0, "S", None, None)
        for p in procs
    }
    return Observation(
        JobTree(10, tuple(procs)), Sampling(samples, {}, seconds, 50), use, seconds, None, (), 4,
        gpu or GpuWindow("none", "no GPU"),
    )  # fmt: skip


def test_workers_waiting_in_file_reads_are_input_io(tmp_path: Path) -> None:
    src = tmp_path / "data.py"
    src.write_text("def load(p):\n    with open(p, 'rb') as f:\n        return f.read()\n")
    read = (Frame("load", str(src), 3), Frame("__getitem__", str(src), 1),
            Frame("_worker_loop", f"{SITE}/torch/utils/data/_utils/worker.py", 1))  # fmt: skip
    obs = _obs(
        {(10, 10): {WAIT_WORKERS: 300, TRAIN: 200}, (11, 11): {read: 400}, (12, 12): {read: 380}},
        workers=(11, 12),
    )
    first = diagnose_attached(obs)[0]
    assert first.id == "input.io" and first.evidence["loaded_by"] == "workers"
    assert first.evidence["loading_work"] == {"file": 780}
    assert first.evidence["data_share_interval"][0] >= 0.5  # 300 of 500 samples


def test_threads_computing_python_for_the_loop_are_input_gil(tmp_path: Path) -> None:
    src = tmp_path / "loop.py"
    src.write_text("def make(i):\n    return sum(x * x for x in range(i))\n"
                   "def main():\n    batch = future.result()\n")  # fmt: skip
    waiting = (Frame("wait", f"{LIB}/threading.py", 320),
               Frame("result", f"{LIB}/concurrent/futures/_base.py", 451),
               Frame("main", str(src), 4))  # fmt: skip
    computing = (Frame("make", str(src), 2),
                 Frame("run", f"{LIB}/concurrent/futures/thread.py", 58))  # fmt: skip
    obs = _obs({(10, 10): {waiting: 350, TRAIN: 150}, (10, 20): {computing: 480}})
    first = diagnose_attached(obs)[0]
    assert (first.id, first.evidence["loaded_by"]) == ("input.gil", "threads")


def test_a_loop_that_sleeps_is_host_sleep_not_healthy(tmp_path: Path) -> None:
    src = tmp_path / "loop.py"
    src.write_text("import time\ndef main():\n    time.sleep(0.05)\n")
    sleeping = (Frame("main", str(src), 3),)
    found = diagnose_attached(_obs({(10, 10): {sleeping: 300, TRAIN: 200}}))
    assert [f.id for f in found] == ["host.sleep"]
    assert found[0].evidence["outside_share"] == 0.6


@pytest.mark.parametrize(("trained", "first"), [(40, "host.sleep"), (0, "failure.hang")])
def test_a_loop_asleep_most_of_each_step_is_not_stuck(
    tmp_path: Path, trained: int, first: str
) -> None:
    # 92 % of the samples in one stack: a hang only when the rest are not steps taken.
    src = tmp_path / "loop.py"
    src.write_text("import time\ndef main():\n    time.sleep(0.05)\n")
    sleeping = (Frame("main", str(src), 3),)
    torn = (Frame("main", str(src), 2),)  # a read that came back short: not a step
    obs = _obs(
        {(10, 10): {sleeping: 460, torn: 40 - trained, **({TRAIN: trained} if trained else {})}}
    )
    obs = replace(obs, use={10: replace(obs.use[10], cpu_s=0.0, state="S")})
    found = diagnose_attached(obs)
    assert found[0].id == first, [(f.id, f.title) for f in found]


@pytest.mark.parametrize(("elsewhere", "first"), [(0, "failure.hang"), (1, "not stuck")])
def test_torn_reads_of_a_thread_hung_in_training_code_are_no_step_one_sample_elsewhere_is(
    elsewhere: int, first: str
) -> None:
    # Hung inside backward: py-spy's torn reads come back as runs of the same frames.
    hung = (Frame("_engine_run_backward", f"{SITE}/torch/autograd/graph.py", 744),
            Frame("backward", f"{SITE}/torch/autograd/__init__.py", 266),
            Frame("backward", f"{SITE}/torch/_tensor.py", 521),
            Frame("main", "/t/train.py", 31))  # fmt: skip
    torn = {hung[1:]: 6, hung[:3]: 5, hung[1:3]: 4}
    obs = _obs({(10, 10): {hung: 480, **torn, **({TRAIN: elsewhere} if elsewhere else {})}})
    obs = replace(obs, use={10: replace(obs.use[10], cpu_s=0.0, state="S")})
    found = [f.id for f in diagnose_attached(obs)]
    if first == "failure.hang":
        assert found[0] == "failure.hang", found
    else:  # one forward at another line: the thread took a step
        assert "failure.hang" not in found, found


def test_a_loss_written_as_functional_ops_is_training_not_host() -> None:
    loss = (Frame("cross_entropy", f"{SITE}/torch/nn/functional.py", 3000),
            Frame("main", "/t/train.py", 31))  # fmt: skip
    found = diagnose_attached(_obs({(10, 10): {loss: 300, TRAIN: 200}}))
    assert [f.id for f in found] == ["run.healthy"]


def _gpu(index: int, pids: tuple[int, ...]) -> GpuSample:
    return GpuSample(0.0, index, "A100", f"GPU-{index}",
                     processes=tuple(GpuProcess(p) for p in pids))  # fmt: skip


def test_the_jobs_gpus_are_told_by_nvml_pids_else_by_device_files() -> None:
    samples = [_gpu(0, (10,)), _gpu(1, (999,)), _gpu(2, ())]
    assert job_gpus(samples, [10, 11], set()) == ((0,), "processes")
    # Another pid namespace (a container): NVML's pids are not the job's.
    assert job_gpus(samples[1:], [10], {2, 7}) == ((2,), "device files")
    assert job_gpus(samples[1:], [10], set()) == ((), "")


def test_gpu_rules_judge_the_windows_readings() -> None:
    hot = [
        GpuSample(float(t), 0, "A100", "GPU-0", temperature_c=91, temperature_slowdown_c=89,
                  sm_clock_mhz=700, sm_clock_max_mhz=1410, clock_event_reasons=0x40 | 0x8,
                  utilization_gpu_pct=99, processes=(GpuProcess(10),))
        for t in range(10)
    ]  # fmt: skip
    window = GpuWindow("simulated", None, tuple(hot), (0,), "processes")
    found = diagnose_attached(_obs({(10, 10): {TRAIN: 500}}, gpu=window))
    assert found[0].id.startswith("thermal.throttle") and found[0].severity.value == "error"


@pytest.mark.parametrize(
    ("sampler_cpu_s", "found"), [(None, "contention.cpu"), (0.5, "run.healthy")]
)
def test_the_wait_attachs_own_sampler_can_cause_is_not_the_machines(
    sampler_cpu_s: float | None, found: str
) -> None:
    # 10 s window: the training thread waited 0.8 s (8 %) for a CPU; py-spy used 0.5 s.
    obs = _obs({(10, 10): {TRAIN: 500}})
    use = replace(obs.use[10], threads={10: ThreadUse(cpu_s=9.0, run_wait_s=0.8)})
    obs = replace(obs, use={10: use},
                  sampling=replace(obs.sampling, sampler_cpu_s=sampler_cpu_s))  # fmt: skip
    first = diagnose_attached(obs)[0]
    assert first.id == found
    if found == "contention.cpu":
        assert first.evidence["train_cpu_wait_share"] == 0.08
        assert first.evidence["attach_sampler_cpu_share"] == 0.0


def test_py_spys_own_cpu_is_measured_from_the_kernels_accounting(tmp_path: Path) -> None:
    # A child that burns CPU: its user + system time comes back, and its output.
    code, said, cpu_s = run_measured(
        [sys.executable, "-c", "import time\nt=time.process_time()\n"
         "while time.process_time()-t<0.3: pass\nprint('Samples: 7 Errors: 1')"],
        tmp_path / "log", 30,
    )  # fmt: skip
    assert (code, said.strip()) == (0, "Samples: 7 Errors: 1")
    assert 0.3 <= cpu_s < 5
    assert run_measured([sys.executable, "-c", "import time; time.sleep(30)"],
                         tmp_path / "log2", 0.5) is None  # fmt: skip
