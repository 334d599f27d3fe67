"""Real CUDA failures, produced by torch on a GPU, classified from their stderr.

These pin the message formats the classifier parses to the torch actually
installed (run by scripts/gpu-check).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from trainmedic.resilience.classify import FailureClass, FailureEvidence, classify_failure

pytestmark = pytest.mark.gpu


def run_failing(code: str, env_extra: dict[str, str] | None = None) -> FailureEvidence:
    import os

    env = {**os.environ, **(env_extra or {})}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    return FailureEvidence.from_stderr_text(proc.returncode, proc.stderr)


def test_real_cuda_oom_is_classified_with_its_sizes() -> None:
    evidence = run_failing(
        """
        import torch
        x = torch.empty(1 << 50, dtype=torch.uint8, device="cuda")  # 1 PiB
        """
    )
    c = classify_failure(evidence)
    assert c.failure_class is FailureClass.CUDA_OOM, evidence.stderr_tail[-5:]
    assert c.details["requested_bytes"] == pytest.approx(2**50, rel=0.01)
    assert c.details["cuda_device"] == 0
    assert 0 <= c.details["free_bytes"] <= c.details["total_bytes"]


def test_real_cuda_oom_with_expandable_segments_still_classifies() -> None:
    evidence = run_failing(
        """
        import torch
        x = torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
        """,
        {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    )
    assert classify_failure(evidence).failure_class is FailureClass.CUDA_OOM


def test_real_device_side_assert_is_a_bug() -> None:
    evidence = run_failing(
        """
        import torch
        logits = torch.randn(4, 3, device="cuda")
        target = torch.tensor([0, 1, 2, 7], device="cuda")  # 7 >= 3 classes
        loss = torch.nn.functional.nll_loss(logits.log_softmax(-1), target)
        print(loss.item())
        """
    )
    c = classify_failure(evidence)
    assert c.failure_class is FailureClass.USER_EXCEPTION, evidence.stderr_tail[-5:]
    assert "device-side assert" in c.why
