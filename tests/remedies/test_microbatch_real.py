"""Micro-batching against real failures: a host allocator out of memory under an
address-space limit, and two DDP ranks (gloo) of which one runs out of memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPTS = Path(__file__).parent / "scripts"


def test_a_real_out_of_memory_completes_through_micro_batches_with_the_full_batchs_gradients() -> (
    None
):
    out = subprocess.run(
        [sys.executable, str(SCRIPTS / "oom_rlimit.py")],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    attempts = result["attempts"]
    assert attempts[0] == [2048, False]  # the whole batch really ran out of memory
    assert attempts[-1][1] is True
    assert attempts[-1][0] < 2048
    assert result["max_abs_diff"] <= 1e-5 * max(1.0, result["max_abs_grad"])


def test_ddp_ranks_agree_on_the_split_and_average_the_full_batches_gradients(
    tmp_path: Path,
) -> None:
    subprocess.run(
        [sys.executable, str(SCRIPTS / "ddp_microbatch.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    # rank 0 alone would fit 16; it follows rank 1 down to 4 (16 -> 8 -> 4)
    for rank in ranks:
        assert rank["attempts"] == [[16, False], [8, False], [4, True], [4, True]]
        assert rank["micro_batch_size"] == 4
        assert rank["max_abs_diff"] < 1e-6
