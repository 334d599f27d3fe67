"""A PyTorch trainer that checkpoints with trainmedic.Checkpointer and pauses like real jobs.

At the steps ``--eval-at`` it runs an *unmarked* evaluation (forward passes
without gradients for ``--pause-s`` seconds); every ``--ckpt-every`` steps it
saves through the Checkpointer, and at step ``--slow-ckpt-at`` it saves and
then waits ``--pause-s`` more inside ``trainmedic.phase("checkpoint")``, as a
save to a slow disk would. It
resumes from the Checkpointer's newest checkpoint by itself. With
``--hang-at N`` its first attempt (no ``<state>/faulted``) hangs in
``time.sleep`` at step N. ``<state>/resumed`` gets the step it resumed from.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

import trainmedic


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", required=True)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--eval-at", type=int, nargs="*", default=[])
    parser.add_argument("--ckpt-every", type=int, default=10)
    parser.add_argument("--slow-ckpt-at", type=int, default=0)
    parser.add_argument("--pause-s", type=float, default=3.5)
    parser.add_argument("--step-s", type=float, default=0.01)
    parser.add_argument("--hang-at", type=int, default=0)
    args = parser.parse_args()
    os.makedirs(args.state, exist_ok=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    ckpt = trainmedic.Checkpointer(keep=2, every_steps=args.ckpt_every)
    start = ckpt.load(model=model, optimizer=opt) or 0
    with open(os.path.join(args.state, "resumed"), "a") as f:
        f.write(f"{start}\n")
    marker = os.path.join(args.state, "faulted")
    x = torch.randn(64, 16)
    y = x.sum(dim=1, keepdim=True)
    for step in range(start + 1, args.steps + 1):
        time.sleep(args.step_s)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step in args.eval_at:
            end = time.monotonic() + args.pause_s
            with torch.no_grad():
                while time.monotonic() < end:
                    model(torch.randn(256, 16))
                    time.sleep(0.005)
        ckpt.maybe_save(step, model=model, optimizer=opt)
        if step == args.slow_ckpt_at:
            with trainmedic.phase("checkpoint"):
                ckpt.save(step, model=model, optimizer=opt)
                time.sleep(args.pause_s)
        if step == args.hang_at and not os.path.exists(marker):
            open(marker, "w").close()
            time.sleep(3600)
    with open(os.path.join(args.state, "done"), "w") as f:
        f.write(f"{args.steps}\n")


if __name__ == "__main__":
    main()
