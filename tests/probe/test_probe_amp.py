"""GradScaler's skipped optimizer steps: one step record per iteration, skips counted.

Runs a real GradScaler on CPU (torch supports CPU loss scaling) whose every
third iteration has an infinite loss, so GradScaler skips ``optimizer.step()``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from .probed import SCRIPTS, run_probed


def test_every_iteration_is_a_step_and_skips_are_reported(tmp_path: Path) -> None:
    run = run_probed([sys.executable, str(SCRIPTS / "amp_skips.py"), "30", "3", "cpu"], tmp_path)
    assert run.proc.returncode == 0, run.proc.stderr
    assert "skipped 10" in run.proc.stdout
    assert [e for e in run.events if e.kind == "probe_error"] == []
    train = [s for s in run.steps if s.phase == "train"]
    # Without the GradScaler wrapper each skipped iteration would merge into the next: 20.
    assert [s.step for s in train] == list(range(1, 31))
    assert all(s.compute_s is not None and s.compute_s > 0 for s in train)
    scaler = [e for e in run.events if e.kind == "grad_scaler"]
    each = [e for e in scaler if not e.data["final"]]
    assert [e.data["step"] for e in each] == [3, 6, 9, 12, 15, 18, 21, 24, 27, 30]
    # The scale halves on each skip: 1024, 512, ...
    assert [e.data["scale"] for e in each[:3]] == [1024.0, 512.0, 256.0]
    (final,) = [e for e in scaler if e.data["final"]]
    assert final.data["skipped"] == 10 and final.data["scaler_steps"] == 30
    assert final.data["skipped_after_warmup"] == 0  # all within the first 100 steps
