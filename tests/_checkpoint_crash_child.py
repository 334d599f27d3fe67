"""The child of the crash-consistency test: resume, then save checkpoints forever.

Kept apart from the test module so that a freshly forked child imports only
this file (torch and trainmedic are preloaded by the fork server), not pytest.
"""

from __future__ import annotations

from multiprocessing.connection import Connection

import torch

from trainmedic.checkpoint import Checkpointer

MODEL_SHAPE = (256, 256)
"""256 KiB of float32: one save takes about a millisecond."""


def crash_child(directory: str, conn: Connection) -> None:
    """Resume from ``directory``, then save step after step, reporting through ``conn``.

    Every parameter is set to the step number before saving, so a loaded
    checkpoint proves its own integrity: every value equals the step it claims.
    """
    ckpt = Checkpointer(directory, keep=3)
    model = torch.nn.Linear(*MODEL_SHAPE, bias=False)
    step = ckpt.load(model=model) or 0
    conn.send(("resumed", step))
    while True:
        step += 1
        with torch.no_grad():
            model.weight.fill_(step)
        conn.send(("begin", step))
        ckpt.save(step, model=model, extra={"step": step})
        conn.send(("done", step))
