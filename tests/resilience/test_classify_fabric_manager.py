"""CUDA error 802 (``cudaErrorSystemNotReady``): the NVSwitch Fabric Manager is not
running, a fault of the machine that no restart on it escapes."""

from __future__ import annotations

import pytest

from trainmedic.findings.model import Category
from trainmedic.gpu import faults
from trainmedic.resilience.classify import (
    Classification,
    FailureClass,
    FailureEvidence,
    classification_to_finding,
    classify_failure,
)
from trainmedic.resilience.errorfile import ErrorReport
from trainmedic.resilience.policy import AttemptRecord, RestartState, default_policy
from trainmedic.resilience.remedies import plan_remedies

# torch >= 1.8 on an HGX H100 whose nvidia-fabricmanager is stopped: the warning from
# torch.cuda.is_available(), then the lazy initialisation's error.
TORCH_INIT = """\
/usr/lib/python3/dist-packages/torch/cuda/__init__.py:129: UserWarning: CUDA initialization: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling NumCudaDevices() that might have already set an error? Error 802: system not yet initialized (Triggered internally at ../c10/cuda/CUDAFunctions.cpp:108.)
  return torch._C._cuda_getDeviceCount() > 0
Traceback (most recent call last):
  File "/workspace/train.py", line 41, in <module>
    model = build_model().cuda()
  File "/usr/lib/python3/dist-packages/torch/nn/modules/module.py", line 916, in cuda
    return self._apply(lambda t: t.cuda(device))
  File "/usr/lib/python3/dist-packages/torch/cuda/__init__.py", line 302, in _lazy_init
    torch._C._cuda_init()
RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling NumCudaDevices() that might have already set an error? Error 802: system not yet initialized
"""  # noqa: E501
# torch 1.4's form of the same error.
TORCH_OLD = """\
Traceback (most recent call last):
  File "train.py", line 12, in <module>
    x = torch.zeros(1).cuda()
RuntimeError: cuda runtime error (802) : system not yet initialized at /opt/conda/conda-bld/pytorch_1579022034529/work/aten/src/THC/THCGeneral.cpp:50
"""  # noqa: E501
# A CUDA call checked by C10_CUDA_CHECK, under torchrun.
TORCH_CHECK = """\
[rank0]: Traceback (most recent call last):
[rank0]:   File "/workspace/train.py", line 88, in <module>
[rank0]:     torch.cuda.set_device(local_rank)
[rank0]: RuntimeError: CUDA error: system not yet initialized
[rank0]: CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be incorrect.
"""  # noqa: E501
CUPY = "cupy_backends.cuda.api.runtime.CUDARuntimeError: cudaErrorSystemNotReady: system not yet initialized"  # noqa: E501
SAMPLE = 'CUDA error at bandwidthTest.cu:256 code=802(cudaErrorSystemNotReady) "cudaSetDevice(currentDevice)"'  # noqa: E501
NCCL = "node1:4242:4242 [0] NCCL INFO init.cc:1614 Cuda failure 802 'system not yet initialized'"
GGML = "ggml_cuda_init: failed to initialize CUDA: system not yet initialized"
RETURNED = "cudaGetDeviceCount returned 802"
DRIVER_API = "CUDA driver initialization failed, error 802 (CUDA_ERROR_SYSTEM_NOT_READY)"


@pytest.mark.parametrize(
    "stderr", [TORCH_INIT, TORCH_OLD, TORCH_CHECK, CUPY, SAMPLE, NCCL, GGML, RETURNED, DRIVER_API]
)
def test_error_802_is_the_fabric_manager_down(stderr: str) -> None:
    c = classify_failure(FailureEvidence.from_stderr_text(1, stderr))
    assert c.failure_class is FailureClass.CUDA_ERROR
    assert c.category is Category.DRIVER
    assert c.details["cause"] == "fabric_manager" and c.details["cuda_error_code"] == 802
    assert c.details["node_fault"] is True
    # No GPU of its own to blame: nothing to leave out of the next attempt.
    assert c.gpu is None and not c.details.get("hardware")
    assert plan_remedies(c, {"CUDA_VISIBLE_DEVICES": "0,1"}) == []


def test_the_earliest_line_decides_and_names_where() -> None:
    c = classify_failure(FailureEvidence.from_stderr_text(1, TORCH_INIT))
    assert "Error 802" in c.evidence_lines[0] and "UserWarning" in c.evidence_lines[0]
    assert "Fabric Manager" in c.why


def test_the_error_file_says_the_same() -> None:
    report = ErrorReport(
        t=0.0,
        pid=4242,
        exc_type="RuntimeError",
        message="Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions "
        "before calling NumCudaDevices() that might have already set an error? Error 802: "
        "system not yet initialized",
        traceback='Traceback (most recent call last):\n  File "train.py", line 41, in <module>\n'
        "    model = build_model().cuda()\n",
    )
    c = classify_failure(FailureEvidence(exit_code=1, error_reports=(report,)))
    assert c.details["cause"] == "fabric_manager"


def test_the_fix_names_the_service_and_the_machine() -> None:
    c = classify_failure(FailureEvidence.from_stderr_text(1, TORCH_CHECK))
    fix = classification_to_finding(c).fix
    assert "systemctl status nvidia-fabricmanager" in fix
    assert "sudo systemctl start nvidia-fabricmanager" in fix
    assert "NVSwitch" in fix and "HGX" in fix
    assert fix.startswith(faults.FABRIC_MANAGER_FIX)
    assert "does not restart" in fix


def test_a_hardware_xid_does_not_turn_it_into_one_gpus_fault() -> None:
    xid = "NVRM: Xid (PCI:0000:3b:00): 79, pid=9, name=python3, GPU has fallen off the bus."
    c = classify_failure(FailureEvidence.from_stderr_text(1, TORCH_CHECK, kernel_log=(xid,)))
    assert c.details["cause"] == "fabric_manager" and c.category is Category.DRIVER


def state(c: Classification) -> RestartState:
    return RestartState(
        started_at=0.0, now=10.0, attempts=(AttemptRecord(1, c, 10.0, steps_reached=0),)
    )


@pytest.mark.parametrize("retry_on_exception", [False, True])
def test_it_is_not_restarted_on_this_machine(retry_on_exception: bool) -> None:
    c = classify_failure(FailureEvidence.from_stderr_text(1, TORCH_INIT))
    policy = default_policy(backoff_s=0, retry_on_exception=retry_on_exception)
    decision = policy.decide(state(c), c)
    assert not decision.restart
    assert "retry_unless_node_fault" in decision.reason


@pytest.mark.parametrize(
    ("stderr", "failure_class"),
    [
        # 802 as a number, on lines that mention CUDA or not.
        ("step 802/1000 loss 0.4127 on cuda:0\nKilled", FailureClass.UNKNOWN),
        (
            "RuntimeError: CUDA error: an illegal memory access was encountered (batch 802)",
            FailureClass.CUDA_ERROR,
        ),
        ("RuntimeError: CUDA out of memory. Tried to allocate 802.00 MiB", FailureClass.CUDA_OOM),
        # "system not yet initialized" from something that is not CUDA.
        (
            "Traceback (most recent call last):\n"
            '  File "train.py", line 3, in <module>\n'
            "RuntimeError: logging system not yet initialized",
            FailureClass.USER_EXCEPTION,
        ),
    ],
)
def test_other_lines_are_not_the_fabric_manager(stderr: str, failure_class: FailureClass) -> None:
    c = classify_failure(FailureEvidence.from_stderr_text(1, stderr))
    assert c.failure_class is failure_class
    assert c.details.get("cause") != "fabric_manager" and not c.details.get("node_fault")


def test_other_cuda_errors_are_still_restarted() -> None:
    c = classify_failure(
        FailureEvidence.from_stderr_text(1, "RuntimeError: CUDA error: unspecified launch failure")
    )
    assert default_policy(backoff_s=0).decide(state(c), c).restart
