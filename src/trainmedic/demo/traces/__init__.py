"""A real torch.profiler trace for ``trainmedic demo --scenario gpu-trace`` (NOTICE.md
says where it comes from and its licence)."""

from __future__ import annotations

from pathlib import Path

DEMO_TRACE = Path(__file__).resolve().parent / "sampled-rank0.json.gz"
"""Rank 0 of a 128-rank data-parallel job, two ProfilerSteps: its GPU busy 45 % of each
step, NCCL alone on it 27 %."""
