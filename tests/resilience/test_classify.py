"""classify_failure on realistic evidence for every failure class."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from trainmedic.findings.model import Category, Severity
from trainmedic.gpu.types import normalize_pci_bus_id
from trainmedic.resilience.classify import (
    FailureClass,
    FailureEvidence,
    GpuFault,
    GpuRef,
    classification_to_finding,
    classify_failure,
)
from trainmedic.resilience.errorfile import ErrorReport

# ---------------------------------------------------------------- builders


def make_evidence(exit_code: int | None, stderr: str = "", **kwargs: Any) -> FailureEvidence:
    return FailureEvidence.from_stderr_text(
        exit_code, textwrap.dedent(stderr).strip("\n"), **kwargs
    )


def make_report(exc_type: str, message: str, t: float = 100.0, pid: int = 4242) -> ErrorReport:
    return ErrorReport(t=t, pid=pid, exc_type=exc_type, message=message, rank=0)


OOM_NEW = """\
    Traceback (most recent call last):
      File "/home/user/train.py", line 88, in <module>
        loss = model(x).sum()
               ^^^^^^^^
      File "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1773, in _wrapped_call_impl
        return self._call_impl(*args, **kwargs)
      File "/home/user/model.py", line 41, in forward
        h = self.mlp(x)
      File "/opt/venv/lib/python3.11/site-packages/torch/nn/functional.py", line 2380, in gelu
        return torch._C._nn.gelu(input)
    torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 GiB of which 1.38 GiB is free. Including non-PyTorch memory, this process has 77.76 GiB memory in use. Of the allocated memory 75.20 GiB is allocated by PyTorch, and 1.06 GiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)
"""  # noqa: E501

OOM_OLD = """\
    Traceback (most recent call last):
      File "train.py", line 30, in <module>
        out = net(batch)
    RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 1; 15.78 GiB total capacity; 14.21 GiB already allocated; 3.44 MiB free; 14.38 GiB reserved in total by PyTorch) If reserved memory is >> allocated memory try setting max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF
"""  # noqa: E501

NCCL_TIMEOUT = """\
    [rank1]:[E1129 10:01:02.123456789 ProcessGroupNCCL.cpp:632] [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2043, OpType=ALLREDUCE, NumelIn=25557032, NumelOut=25557032, Timeout(ms)=600000) ran for 600033 milliseconds before timing out.
    [rank1]:[E1129 10:01:02.124061 ProcessGroupNCCL.cpp:2268] [PG ID 0 PG GUID 0(default_pg) Rank 1]  failure detected by watchdog at work sequence id: 2043 PG status: last enqueued work: 2043, last completed work: 2042
    [rank1]:[E1129 10:01:02.124080 ProcessGroupNCCL.cpp:681] [Rank 1] Some NCCL operations have failed or timed out. Due to the asynchronous nature of CUDA kernels, subsequent GPU operations might run on corrupted/incomplete data.
    [rank1]:[E1129 10:01:02.124093 ProcessGroupNCCL.cpp:695] [Rank 1] To avoid data inconsistency, we are taking the entire process down.
    terminate called after throwing an instance of 'c10::DistBackendError'
      what():  [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated with exception: [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2043, OpType=ALLREDUCE, NumelIn=25557032, NumelOut=25557032, Timeout(ms)=600000) ran for 600033 milliseconds before timing out.
"""  # noqa: E501

GLOO_TIMEOUT = """\
    Traceback (most recent call last):
      File "/work/train.py", line 71, in <module>
        dist.all_reduce(t)
    RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 1800000ms for recv operation to complete
"""  # noqa: E501

WORKER_BUS_ERROR = """\
    ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).
    Traceback (most recent call last):
      File "/opt/venv/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 1251, in _try_get_data
        data = self._data_queue.get(timeout=timeout)
    _queue.Empty

    The above exception was the direct cause of the following exception:

    Traceback (most recent call last):
      File "/home/user/train.py", line 64, in <module>
        for batch in loader:
    RuntimeError: DataLoader worker (pid 1234) is killed by signal: Bus error. It is possible that dataloader's workers are out of shared memory. Please try to raise your shared memory limit.
"""  # noqa: E501

ILLEGAL_ACCESS = """\
    Traceback (most recent call last):
      File "/home/user/train.py", line 51, in <module>
        print(loss.item())
    torch.AcceleratorError: CUDA error: an illegal memory access was encountered
    CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
    For debugging consider passing CUDA_LAUNCH_BLOCKING=1
    Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.
"""  # noqa: E501

KEY_ERROR = """\
    Epoch 3:  41%|████      | 410/1000 [03:10<04:33,  2.16it/s]
    Traceback (most recent call last):
      File "/home/user/train.py", line 120, in <module>
        main()
      File "/home/user/train.py", line 97, in main
        labels = batch["label"]
                 ~~~~~^^^^^^^^^
    KeyError: 'label'
"""

XID_79 = "[ 8123.456789] NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus."  # noqa: E501


# ------------------------------------------------------------------ classes


def test_exit_zero_is_success() -> None:
    c = classify_failure(make_evidence(0, "done"))
    assert c.failure_class is FailureClass.SUCCESS
    assert classification_to_finding(c).severity is Severity.INFO


def test_cuda_oom_parses_the_current_message() -> None:
    c = classify_failure(make_evidence(1, OOM_NEW))
    assert c.failure_class is FailureClass.CUDA_OOM
    assert c.category is Category.GPU_MEMORY
    assert c.confidence == "high"
    assert c.details["requested_bytes"] == 2 * 2**30
    assert c.details["cuda_device"] == 0
    assert c.details["free_bytes"] == int(1.38 * 2**30)
    assert c.details["total_bytes"] == int(79.15 * 2**30)
    assert c.details["reserved_unallocated_bytes"] == int(1.06 * 2**30)
    assert c.details["allocated_bytes"] == int(75.20 * 2**30)
    # The innermost frame in the user's code, not in torch.
    assert c.location == "/home/user/model.py:41 in forward"
    # Without the machine's GPUs, torch's "GPU 0" stays the process's CUDA device.
    assert "2.00 GiB on CUDA device 0 with 1.38 GiB free of 79.15 GiB" in c.why
    assert c.gpu is None
    assert c.evidence_lines[0].startswith("torch.OutOfMemoryError: CUDA out of memory")


def test_cuda_oom_parses_the_pre_2_1_message() -> None:
    c = classify_failure(make_evidence(1, OOM_OLD))
    assert c.failure_class is FailureClass.CUDA_OOM
    assert c.details["requested_bytes"] == 20 * 2**20
    assert c.details["cuda_device"] == 1
    assert c.details["reserved_bytes"] == int(14.38 * 2**30)
    assert c.gpu is None and "gpu_index" not in c.details


def test_cuda_oom_from_the_error_file_is_high_confidence_and_names_the_pid() -> None:
    report = make_report(
        "torch.OutOfMemoryError", "CUDA out of memory. Tried to allocate 1.00 GiB."
    )
    c = classify_failure(make_evidence(1, "", error_reports=(report,)))
    assert c.failure_class is FailureClass.CUDA_OOM
    assert c.details["pid"] == 4242
    assert "error file of pid 4242" in c.why


@pytest.mark.parametrize(
    ("stderr", "exit_code", "requested"),
    [
        (
            "RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: not "
            "enough memory: you tried to allocate 68719476736 bytes.",
            1,
            68719476736,
        ),
        (
            "terminate called after throwing an instance of 'std::bad_alloc'\n"
            "  what():  std::bad_alloc",
            -6,
            None,
        ),
        (
            "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 7.45 GiB for an array "
            "with shape (1000000000,) and data type float64",
            1,
            None,
        ),
        ("OSError: [Errno 12] Cannot allocate memory", 1, None),
        ("MemoryError", 1, None),
    ],
)
def test_host_allocation_failures(stderr: str, exit_code: int, requested: int | None) -> None:
    c = classify_failure(make_evidence(exit_code, stderr))
    assert c.failure_class is FailureClass.HOST_ALLOC_FAILURE
    assert c.details.get("requested_bytes") == requested


def test_sigkill_with_a_cgroup_oom_kill_is_a_host_oom_kill() -> None:
    c = classify_failure(
        make_evidence(-9, "Epoch 1: 12%|█▏  | 120/1000", oom_kill_delta=1, num_workers=8)
    )
    assert c.failure_class is FailureClass.HOST_OOM_KILL
    assert c.confidence == "high"
    assert c.details == {"oom_kill_delta": 1, "num_workers": 8}


def test_kernel_oom_line_for_a_job_process_is_a_host_oom_kill() -> None:
    log = ("[ 9000.1] Out of memory: Killed process 4242 (python) total-vm:81234567kB",)
    ours = classify_failure(make_evidence(-9, kernel_log=log, job_pids=frozenset({4242})))
    assert ours.failure_class is FailureClass.HOST_OOM_KILL
    assert ours.confidence == "high"
    theirs = classify_failure(make_evidence(-9, kernel_log=log, job_pids=frozenset({7})))
    assert theirs.failure_class is FailureClass.UNKNOWN


def test_torchrun_summary_gives_the_worker_signal() -> None:
    stderr = """\
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
        ============================================================
        train.py FAILED
        ------------------------------------------------------------
        Root Cause (first observed failure):
        [0]:
          time      : 2026-11-29_10:01:02
          host      : node7
          rank      : 0 (local_rank: 0)
          exitcode  : -9 (pid: 4242)
          error_file: <N/A>
          traceback : Signal 9 (SIGKILL) received by PID 4242
        ============================================================
    """
    c = classify_failure(make_evidence(1, stderr, oom_kill_delta=2))
    assert c.failure_class is FailureClass.HOST_OOM_KILL
    assert c.signal == 9
    assert "torchrun summary" in c.why


def test_shell_style_exit_137_is_read_as_sigkill() -> None:
    c = classify_failure(make_evidence(137, "", oom_kill_delta=1))
    assert c.failure_class is FailureClass.HOST_OOM_KILL
    assert c.signal_name == "SIGKILL"


def test_illegal_memory_access_is_a_cuda_error() -> None:
    c = classify_failure(make_evidence(1, ILLEGAL_ACCESS))
    assert c.failure_class is FailureClass.CUDA_ERROR
    assert c.details["error"] == "an illegal memory access was encountered"
    assert c.category is Category.TIMEOUT
    assert c.location == "/home/user/train.py:51 in <module>"


def test_ecc_error_message_is_a_hardware_fault() -> None:
    c = classify_failure(
        make_evidence(1, "RuntimeError: CUDA error: uncorrectable ECC error encountered")
    )
    assert c.failure_class is FailureClass.CUDA_ERROR
    assert c.category is Category.HARDWARE_FAULT


def test_no_kernel_image_is_a_driver_mismatch() -> None:
    stderr = "RuntimeError: CUDA error: no kernel image is available for execution on the device"
    c = classify_failure(make_evidence(1, stderr))
    assert c.failure_class is FailureClass.CUDA_ERROR
    assert c.category is Category.DRIVER
    assert "torch build" in classification_to_finding(c).fix


def test_xid_79_in_the_kernel_log_names_the_gpu() -> None:
    stderr = "RuntimeError: CUDA error: unspecified launch failure"
    c = classify_failure(make_evidence(1, stderr, kernel_log=(XID_79,)))
    assert c.failure_class is FailureClass.CUDA_ERROR
    assert c.category is Category.HARDWARE_FAULT
    assert c.gpu == GpuRef(pci_bus_id="0000:3b:00.0")
    assert c.details["xid"] == 79
    assert "fallen off the bus" in c.why
    finding = classification_to_finding(c)
    assert finding.subject == "0000:3b:00.0"
    assert "Drain" in finding.fix


def test_application_xid_13_is_not_a_hardware_fault() -> None:
    log = ("NVRM: Xid (PCI:0000:3b:00): 13, pid=4242, Graphics SM Warp Exception",)
    c = classify_failure(make_evidence(-11, "", kernel_log=log))
    assert c.failure_class is FailureClass.SEGFAULT


def test_gpu_sampler_fault_explains_a_crash() -> None:
    fault = GpuFault(GpuRef(index=2, uuid="GPU-2222"), "volatile uncorrected ECC errors +3")
    c = classify_failure(make_evidence(-6, "", gpu_faults=(fault,)))
    assert c.failure_class is FailureClass.CUDA_ERROR
    assert c.gpu == GpuRef(index=2, uuid="GPU-2222")
    assert "ECC" in c.why


def test_nccl_watchdog_timeout() -> None:
    c = classify_failure(make_evidence(-6, NCCL_TIMEOUT))
    assert c.failure_class is FailureClass.COLLECTIVE_TIMEOUT
    assert c.category is Category.TIMEOUT
    assert c.details == {
        "seq_num": 2043,
        "op_type": "ALLREDUCE",
        "backend": "nccl",
        "timeout_ms": 600000,
        "rank": 1,
    }
    assert "600 s" in c.why


def test_gloo_timeout() -> None:
    c = classify_failure(make_evidence(1, GLOO_TIMEOUT))
    assert c.failure_class is FailureClass.COLLECTIVE_TIMEOUT
    assert c.details["backend"] == "gloo"
    assert c.details["op_type"] == "recv"
    assert c.details["timeout_ms"] == 1_800_000


def test_rendezvous_store_timeout() -> None:
    stderr = (
        "torch.distributed.DistStoreError: Timed out after 901 seconds waiting for clients. "
        "1/2 clients joined."
    )
    c = classify_failure(make_evidence(1, stderr))
    assert c.failure_class is FailureClass.COLLECTIVE_TIMEOUT
    assert c.details["stage"] == "rendezvous"


def test_worker_bus_error_is_a_shared_memory_problem() -> None:
    c = classify_failure(make_evidence(1, WORKER_BUS_ERROR, num_workers=8))
    assert c.failure_class is FailureClass.DATALOADER_WORKER_DIED
    assert c.category is Category.FRAMEWORK_CONFIG
    assert c.details["cause"] == "shm"
    assert c.details["num_workers"] == 8
    assert "--shm-size" in classification_to_finding(c).fix


def test_worker_killed_by_the_oom_killer() -> None:
    stderr = "RuntimeError: DataLoader worker (pid 5678) is killed by signal: Killed. "
    c = classify_failure(make_evidence(1, stderr, oom_kill_delta=1))
    assert c.failure_class is FailureClass.DATALOADER_WORKER_DIED
    assert c.details["cause"] == "killed"
    assert c.details["worker_pids"] == [5678]
    assert "OOM killer" in c.why


def test_worker_segfault_and_unexpected_exit() -> None:
    crashed = classify_failure(
        make_evidence(
            1, "RuntimeError: DataLoader worker (pid 99) is killed by signal: Segmentation fault. "
        )
    )
    assert crashed.details["cause"] == "crashed"
    exited = classify_failure(
        make_evidence(1, "RuntimeError: DataLoader worker (pid(s) 12, 13) exited unexpectedly")
    )
    assert exited.details == {"worker_pids": [12, 13], "cause": "exited"}


@pytest.mark.parametrize(
    "stderr",
    [
        "RuntimeError: unable to write to file </torch_18692_1954506624_0>: "
        "No space left on device (28)",
        "OSError: [Errno 28] No space left on device: '/dev/shm/torch_1_2'",
    ],
)
def test_shared_memory_full_without_a_worker_line(stderr: str) -> None:
    c = classify_failure(make_evidence(1, stderr))
    assert c.failure_class is FailureClass.DATALOADER_WORKER_DIED
    assert c.details["cause"] == "shm"


def test_disk_full_elsewhere_is_not_shared_memory() -> None:
    stderr = "OSError: [Errno 28] No space left on device: '/data/ckpt/model.pt'"
    c = classify_failure(make_evidence(1, f"Traceback (most recent call last):\n{stderr}"))
    assert c.failure_class is FailureClass.USER_EXCEPTION


def test_file_descriptor_exhaustion() -> None:
    c = classify_failure(make_evidence(1, "RuntimeError: received 0 items of ancdata"))
    assert c.failure_class is FailureClass.DATALOADER_WORKER_DIED
    assert c.details["cause"] == "fd_limit"
    assert "file_system" in classification_to_finding(c).fix


@pytest.mark.parametrize(
    ("exit_code", "expected"), [(-11, "SIGSEGV"), (-7, "SIGBUS"), (-4, "SIGILL")]
)
def test_fatal_signals_are_segfaults(exit_code: int, expected: str) -> None:
    stderr = """\
        Fatal Python error: Segmentation fault

        Current thread 0x00007f3b2d7fe740 (most recent call first):
          File "/opt/venv/lib/python3.11/site-packages/ext/native.py", line 40 in call
          File "/home/user/train.py", line 12 in run
    """
    c = classify_failure(make_evidence(exit_code, stderr))
    assert c.failure_class is FailureClass.SEGFAULT
    assert c.signal_name == expected
    assert c.location == "/home/user/train.py:12 in run"


def test_abort_shows_the_cpp_exception() -> None:
    stderr = (
        "terminate called after throwing an instance of 'c10::Error'\n  what():  invariant broken"
    )
    c = classify_failure(make_evidence(-6, stderr))
    assert c.failure_class is FailureClass.ABORT
    assert c.evidence_lines == (
        "terminate called after throwing an instance of 'c10::Error'",
        "  what():  invariant broken",
    )


def test_python_exception_in_user_code() -> None:
    c = classify_failure(make_evidence(1, KEY_ERROR))
    assert c.failure_class is FailureClass.USER_EXCEPTION
    assert c.details == {"exception_type": "KeyError"}
    assert c.location == "/home/user/train.py:97 in main"
    assert c.why == "uncaught KeyError: 'label'"


def test_launcher_wrapper_traceback_is_not_the_root_cause() -> None:
    wrapper = """\
        Traceback (most recent call last):
          File "/opt/venv/bin/torchrun", line 8, in <module>
            sys.exit(main())
        torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
    """
    c = classify_failure(make_evidence(1, textwrap.dedent(KEY_ERROR) + textwrap.dedent(wrapper)))
    assert c.details["exception_type"] == "KeyError"


def test_device_side_assert_is_a_bug() -> None:
    stderr = """\
        ../aten/src/ATen/native/cuda/Loss.cu:250: nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], thread: [5,0,0] Assertion `t >= 0 && t < n_classes` failed.
        RuntimeError: CUDA error: device-side assert triggered
    """  # noqa: E501
    c = classify_failure(make_evidence(1, stderr))
    assert c.failure_class is FailureClass.USER_EXCEPTION
    assert "label" in c.why


def test_error_file_exception_without_a_known_pattern_is_a_user_exception() -> None:
    report = ErrorReport(
        t=1.0, pid=7, exc_type="ValueError", message="bad shape", traceback="", rank=None
    )
    c = classify_failure(make_evidence(1, "", error_reports=(report,)))
    assert c.failure_class is FailureClass.USER_EXCEPTION
    assert c.confidence == "high"
    assert c.details["exception_type"] == "ValueError"


@pytest.mark.parametrize(
    "stderr",
    [
        "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote "
        "process exited or there was a network error, NCCL version 2.21.5",
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error "
        "[10.0.0.2]:41234: Connection reset by peer",
    ],
)
def test_a_lost_peer_is_not_a_bug_and_is_retried(stderr: str) -> None:
    c = classify_failure(make_evidence(1, f"Traceback (most recent call last):\n{stderr}"))
    assert c.failure_class is FailureClass.UNKNOWN
    assert c.category is Category.NETWORK
    assert "another rank failed first" in c.why


def test_earliest_error_file_is_the_root_cause() -> None:
    later = make_report(
        "torch.distributed.DistBackendError", "NCCL communicator was aborted on rank 0", t=105.0
    )
    first = make_report(
        "RuntimeError",
        "DataLoader worker (pid 1234) is killed by signal: Bus error. It is possible that ...",
        t=100.0,
        pid=5,
    )
    c = classify_failure(make_evidence(1, "", error_reports=(later, first)))
    assert c.failure_class is FailureClass.DATALOADER_WORKER_DIED
    assert c.details["pid"] == 5


@pytest.mark.parametrize(
    ("exit_code", "stderr", "kwargs"),
    [
        (127, "", {}),
        (
            None,
            "",
            {"launch_error": "FileNotFoundError: [Errno 2] No such file or directory: 'pyton'"},
        ),
        (
            2,
            "python: can't open file '/home/user/trian.py': [Errno 2] No such file or directory",
            {},
        ),
        (
            2,
            "usage: train.py [-h] --lr LR\n"
            "train.py: error: the following arguments are required: --lr",
            {},
        ),
    ],
)
def test_bad_commands(exit_code: int | None, stderr: str, kwargs: dict[str, Any]) -> None:
    c = classify_failure(make_evidence(exit_code, stderr, **kwargs))
    assert c.failure_class is FailureClass.BAD_COMMAND


def test_sigterm_from_outside_is_preemption() -> None:
    outside = classify_failure(make_evidence(-15))
    assert outside.failure_class is FailureClass.PREEMPTED
    assert outside.confidence == "medium"
    ours = classify_failure(make_evidence(-15, terminated_by_supervisor=True))
    assert ours.confidence == "high"
    assert "trainmedic" in ours.why


def test_declared_hang_with_its_location() -> None:
    c = classify_failure(
        make_evidence(-15, "step 400", hang_declared=True, hang_location="train.py:50 in step")
    )
    assert c.failure_class is FailureClass.HANG
    assert c.location == "train.py:50 in step"
    assert "train.py:50" in c.why


def test_a_hang_on_a_stalled_source_points_outside_the_job() -> None:
    c = classify_failure(
        make_evidence(
            -15,
            "",
            hang_declared=True,
            hang_silence="source_wait",
            hang_source="network: socket 10.0.0.5:9000",
            hang_evidence="worker 42 waits in a network read with nothing arriving",
        )
    )
    assert c.failure_class is FailureClass.HANG
    assert c.category is Category.NETWORK
    assert c.details["source"] == "network: socket 10.0.0.5:9000"
    assert "nothing arriving" in c.why and "10.0.0.5:9000" in c.why
    finding = classification_to_finding(c, attempt=1)
    assert "10.0.0.5:9000" in finding.fix and "restart cannot fix" in finding.fix
    disk = classify_failure(
        make_evidence(
            -15,
            "",
            hang_declared=True,
            hang_silence="source_wait",
            hang_source="filesystem: /mnt/x",
        )
    )
    assert disk.category is Category.IO
    blocked = classify_failure(make_evidence(-15, "", hang_declared=True, hang_silence="blocked"))
    assert blocked.category is Category.TIMEOUT and "blocked" in blocked.why


def test_dataloader_timeout_is_a_hang_in_data_loading() -> None:
    stderr = "RuntimeError: DataLoader timed out after 120 seconds"
    c = classify_failure(make_evidence(1, stderr))
    assert c.failure_class is FailureClass.HANG
    assert c.details == {"dataloader_timeout_s": 120}


def test_declared_hang_explained_by_nccl_is_a_collective_timeout() -> None:
    c = classify_failure(make_evidence(-9, NCCL_TIMEOUT, hang_declared=True))
    assert c.failure_class is FailureClass.COLLECTIVE_TIMEOUT


def test_declared_hang_with_a_fallen_gpu_is_a_hardware_fault() -> None:
    c = classify_failure(make_evidence(-15, "", hang_declared=True, kernel_log=(XID_79,)))
    assert c.failure_class is FailureClass.CUDA_ERROR
    assert c.category is Category.HARDWARE_FAULT
    assert c.why.startswith("the job hung")


def test_sigkill_without_evidence_is_unknown_and_says_why() -> None:
    c = classify_failure(make_evidence(-9))
    assert c.failure_class is FailureClass.UNKNOWN
    assert c.confidence == "low"
    assert "memory.events was unreadable" in c.why


def test_silent_nonzero_exit_is_unknown() -> None:
    c = classify_failure(make_evidence(3, "loss 0.1\nloss 0.09"))
    assert c.failure_class is FailureClass.UNKNOWN
    assert "exit status 3" in c.why


# ----------------------------------------------------------------- findings


def test_every_class_becomes_a_finding_with_a_fix() -> None:
    samples = {
        FailureClass.CUDA_OOM: make_evidence(1, OOM_NEW),
        FailureClass.COLLECTIVE_TIMEOUT: make_evidence(-6, NCCL_TIMEOUT),
        FailureClass.USER_EXCEPTION: make_evidence(1, KEY_ERROR),
        FailureClass.HANG: make_evidence(-15, hang_declared=True),
        FailureClass.UNKNOWN: make_evidence(-9),
    }
    for fc, evidence in samples.items():
        c = classify_failure(evidence)
        assert c.failure_class is fc
        f = classification_to_finding(c, attempt=2, action="restarted after 7 s")
        assert f.id == f"failure.{fc.value}"
        assert f.severity is Severity.ERROR
        assert f.fix
        assert f.evidence["attempt"] == 2
        assert f.evidence["action"] == "restarted after 7 s"
        assert f.to_dict()["category"] == c.category.value


def test_oom_finding_carries_measured_bytes() -> None:
    f = classification_to_finding(classify_failure(make_evidence(1, OOM_NEW)))
    assert f.evidence["requested_bytes"] == 2 * 2**30
    assert f.evidence["exit_code"] == 1
    assert "expandable_segments" in f.fix


def test_pci_bus_ids_normalise_across_sources() -> None:
    assert normalize_pci_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalize_pci_bus_id("0000:3b:00") == "0000:3b:00.0"
    assert GpuRef(pci_bus_id="00000000:3B:00.0").same_gpu(GpuRef(pci_bus_id="0000:3b:00"))


def test_a_keyboard_interrupt_raised_in_the_job_is_a_stop_not_a_bug() -> None:
    # Ctrl-C while the job imports torch: Python raises it and the job exits 1.
    stderr = (
        "Traceback (most recent call last):\n"
        '  File "/w/train.py", line 1, in <module>\n'
        "    import torch\n"
        '  File "/venv/lib/python3.11/site-packages/torch/__init__.py", line 290, in <module>\n'
        "    from torch._C import *\n"
        "KeyboardInterrupt\n"
    )
    c = classify_failure(make_evidence(1, stderr))
    assert c.failure_class is FailureClass.PREEMPTED
    assert "interrupted (SIGINT, Ctrl-C)" in c.why


def test_every_failure_class_has_one_entry_in_the_catalogue() -> None:
    from trainmedic.resilience.classify.catalogue import CLASSES
    from trainmedic.resilience.classify.findings import FIXES, TITLES
    from trainmedic.resilience.policy import NOT_RETRIED_BY_DEFAULT

    assert set(CLASSES) == set(FailureClass)
    assert all(info.title for info in CLASSES.values())
    assert all(info.fix for fc, info in CLASSES.items() if fc is not FailureClass.SUCCESS)
    assert set(NOT_RETRIED_BY_DEFAULT) == {
        FailureClass.USER_EXCEPTION,
        FailureClass.BAD_COMMAND,
        FailureClass.PREEMPTED,
    }
    assert FIXES[FailureClass.HANG] == CLASSES[FailureClass.HANG].fix
    assert TITLES[FailureClass.CUDA_OOM] == "The job ran out of GPU memory"
