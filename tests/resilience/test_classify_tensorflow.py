"""TensorFlow's and XLA's own error texts: out of memory on a GPU or the host, CUDA errors
as StreamExecutor names them, collectives that time out or are aborted, and the fixes and
remedies that fit TensorFlow (not torch's allocator setting)."""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from trainmedic.findings.model import Category
from trainmedic.gpu.types import GpuSample
from trainmedic.resilience.classify import (
    FailureClass,
    FailureEvidence,
    classification_to_finding,
    classify_failure,
)
from trainmedic.resilience.remedies import plan_remedies

# A Keras 3 job on TensorFlow 2.x that runs out of GPU memory: the allocator's warnings
# first (one of them says it is "not a failure"), then the error that ends the job.
TF_GPU_OOM = """\
    2026-11-30 10:01:02.123456: W tensorflow/core/common_runtime/bfc_allocator.cc:309] Allocator (GPU_0_bfc) ran out of memory trying to allocate 2.25GiB with freed_by_count=0. The caller indicates that this is not a failure, but this may mean that there could be performance gains if more memory were available.
    2026-11-30 10:01:03.200000: W tensorflow/tsl/framework/bfc_allocator.cc:485] Allocator (GPU_0_bfc) ran out of memory trying to allocate 4.00GiB (rounded to 4294967296)requested by op StatefulPartitionedCall/sequential/conv2d/Conv2D
    Traceback (most recent call last):
      File "/home/user/train_keras.py", line 61, in <module>
        model.fit(ds, epochs=3)
      File "/opt/venv/lib/python3.11/site-packages/keras/src/utils/traceback_utils.py", line 122, in error_handler
        raise e.with_traceback(filtered_tb) from None
      File "/opt/venv/lib/python3.11/site-packages/tensorflow/python/eager/execute.py", line 53, in quick_execute
        tensors = pywrap_tfe.TFE_Py_Execute(ctx._handle, device_name, op_name,
    tensorflow.python.framework.errors_impl.ResourceExhaustedError: Graph execution error:

    Detected at node sequential_1/conv2d_1/convolution defined at (most recent call last):
    OOM when allocating tensor with shape[256,64,128,128] and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc
    \t [[{{node sequential_1/conv2d_1/convolution}}]]
    Hint: If you want to see a list of allocated tensors when OOM happens, add report_tensor_allocations_upon_oom to RunOptions for current allocation info. This isn't available when running in Eager mode.
     [Op:__inference_multi_step_on_iterator_2113]
"""  # noqa: E501

TF_OLD_OOM_NO_DEVICE = """\
    Traceback (most recent call last):
      File "gan.py", line 140, in <module>
        combined.fit(x, y)
    tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating tensor with shape[209715200,30] and type double
"""  # noqa: E501

TF_CPU_OOM = """\
    Traceback (most recent call last):
      File "train.py", line 12, in <module>
        x = tf.zeros([1 << 20, 1 << 16])
    tensorflow.python.framework.errors_impl.ResourceExhaustedError: {{function_node __wrapped__Fill_device_/job:localhost/replica:0/task:0/device:CPU:0}} OOM when allocating tensor with shape[1048576,65536] and type float on /job:localhost/replica:0/task:0/device:CPU:0 by allocator cpu [Op:Fill] name:
"""  # noqa: E501

XLA_OOM = """\
    Traceback (most recent call last):
      File "train.py", line 30, in <module>
        model.fit(ds)
    tensorflow.python.framework.errors_impl.ResourceExhaustedError: Graph execution error:
    RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.
"""

TF_ILLEGAL_ADDRESS = """\
    2026-11-30 10:05:00.000000: E external/local_xla/xla/stream_executor/cuda/cuda_driver.cc:1200] failed to synchronize the stop event: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered
    tensorflow.python.framework.errors_impl.InternalError: Failed to launch CUDA kernel: CUDA_ERROR_ILLEGAL_ADDRESS
"""  # noqa: E501

TF_ECC = """\
    tensorflow.python.framework.errors_impl.InternalError: stream did not block host until done; was already in an error state: CUDA_ERROR_ECC_UNCORRECTABLE: uncorrectable ECC error encountered
"""  # noqa: E501

TF_CUDNN_INIT = """\
    tensorflow.python.framework.errors_impl.UnknownError: Failed to get convolution algorithm. This is probably because cuDNN failed to initialize, so try looking to see if a warning log message was printed above.
"""  # noqa: E501

TF_NO_GPU_IS_NO_FAILURE = """\
    2026-11-30 10:00:00.000000: E external/local_xla/xla/stream_executor/cuda/cuda_driver.cc:152] failed call to cuInit: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected
    Traceback (most recent call last):
      File "/home/user/train.py", line 9, in <module>
        raise ValueError("bad config")
    ValueError: bad config
"""  # noqa: E501

TF_COLLECTIVE_TIMEOUT = """\
    Traceback (most recent call last):
      File "/home/user/train_mwms.py", line 40, in <module>
        model.fit(ds, epochs=2)
    tensorflow.python.framework.errors_impl.DeadlineExceededError: Collective has timed out waiting for other workers.
"""  # noqa: E501

TF_COLLECTIVE_ABORTED = """\
    Traceback (most recent call last):
      File "/home/user/train_mwms.py", line 40, in <module>
        model.fit(ds, epochs=2)
    tensorflow.python.framework.errors_impl.UnavailableError: Collective ops is aborted by: failed to connect to all addresses
    The error could be from a previous operation. Restart your program to reset.
"""  # noqa: E501


def _classify(stderr: str, exit_code: int = 1, **kw: Any):  # type: ignore[no-untyped-def]
    return classify_failure(
        FailureEvidence.from_stderr_text(exit_code, textwrap.dedent(stderr).strip("\n"), **kw)
    )


def test_a_gpu_oom_names_the_tensor_the_device_and_its_size() -> None:
    c = _classify(TF_GPU_OOM)
    assert (c.failure_class, c.category, c.confidence) == (
        FailureClass.CUDA_OOM, Category.GPU_MEMORY, "high",
    )  # fmt: skip
    d = c.details
    assert (d["framework"], d["device"], d["cuda_device"]) == ("tensorflow", "GPU", 0)
    assert d["tensor_shape"] == [256, 64, 128, 128] and d["dtype"] == "float"
    assert d["requested_bytes"] == 256 * 64 * 128 * 128 * 4  # 1 GiB of float32
    assert "1.00 GiB (a float tensor of shape [256x64x128x128]) on CUDA device 0" in c.why
    assert c.location == "/home/user/train_keras.py:61 in <module>"
    # The fix speaks TensorFlow, not torch's allocator.
    fix = classification_to_finding(c).fix
    assert "mixed_float16" in fix and "TF_FORCE_GPU_ALLOW_GROWTH" in fix
    assert "PYTORCH_CUDA_ALLOC_CONF" not in fix
    names = [r.name for r in plan_remedies(c, {}, torch_version="2.13.0")]
    assert names == ["micro_batch"]


def test_the_allocators_not_a_failure_warning_alone_is_no_oom() -> None:
    # Its warning, then the job fails for a reason of its own: that reason decides.
    warning = TF_GPU_OOM.splitlines()[0]
    c = _classify(warning + "\n" + TF_NO_GPU_IS_NO_FAILURE)
    assert c.failure_class is FailureClass.USER_EXCEPTION
    assert "bad config" in c.why


def test_an_oom_text_without_a_device_is_told_by_the_machine() -> None:
    # No device in the text: on a machine without GPUs it is the host's memory...
    host = _classify(TF_OLD_OOM_NO_DEVICE)
    assert host.failure_class is FailureClass.HOST_ALLOC_FAILURE
    assert host.details["requested_bytes"] == 209715200 * 30 * 8
    assert "tf.data" in classification_to_finding(host).fix
    # ...and on a GPU machine, a GPU's (TensorFlow places tensors there).
    gpu = _classify(TF_OLD_OOM_NO_DEVICE, gpus=(GpuSample(0.0, 0, "A100", "GPU-a"),))
    assert gpu.failure_class is FailureClass.CUDA_OOM and gpu.details["device"] == "GPU"


def test_a_cpu_devices_oom_is_a_host_allocation_failure() -> None:
    c = _classify(TF_CPU_OOM)
    assert c.failure_class is FailureClass.HOST_ALLOC_FAILURE
    assert c.details["cpu_device"] == 0 and c.details["requested_bytes"] == 1 << 38
    assert "TensorFlow ran out of host (CPU) memory allocating 256.00 GiB" in c.why


def test_xlas_oom_is_a_gpu_oom_with_its_size() -> None:
    c = _classify(XLA_OOM)
    assert c.failure_class is FailureClass.CUDA_OOM
    assert c.details == {"framework": "xla", "device": "GPU", "requested_bytes": 16 * 2**30}
    assert c.why.startswith("XLA ran out of GPU memory allocating 16.00 GiB")


@pytest.mark.parametrize(
    ("stderr", "category", "error"),
    [
        (TF_ILLEGAL_ADDRESS, Category.TIMEOUT, "CUDA_ERROR_ILLEGAL_ADDRESS"),
        (TF_ECC, Category.HARDWARE_FAULT, "CUDA_ERROR_ECC_UNCORRECTABLE"),
        (TF_CUDNN_INIT, Category.TIMEOUT, "cuDNN failed to initialize"),
    ],
)
def test_cuda_errors_as_tensorflow_words_them(stderr: str, category: Category, error: str) -> None:
    c = _classify(stderr)
    assert (c.failure_class, c.category) == (FailureClass.CUDA_ERROR, category)
    assert error in c.details["error"]


def test_a_missing_gpu_that_tensorflow_logs_and_lives_with_is_no_cuda_error() -> None:
    c = _classify(TF_NO_GPU_IS_NO_FAILURE)
    assert c.failure_class is FailureClass.USER_EXCEPTION


def test_a_collective_that_timed_out_and_one_aborted_by_a_lost_worker() -> None:
    timeout = _classify(TF_COLLECTIVE_TIMEOUT)
    assert timeout.failure_class is FailureClass.COLLECTIVE_TIMEOUT
    assert timeout.details["backend"] == "tensorflow"
    aborted = _classify(TF_COLLECTIVE_ABORTED)
    # A lost peer: not this process's bug, so it is restarted, not given up on.
    assert (aborted.failure_class, aborted.category) == (FailureClass.UNKNOWN, Category.NETWORK)
    assert "another rank failed first" in aborted.why
