"""A whole training step, ``optimizer.step()`` included, compiled with CUDA graph trees
(not written for trainmedic).

Arguments: steps, how: ``reduce-overhead`` (``torch.compile(mode="reduce-overhead")``:
inductor, which needs Triton and a C compiler) or ``cudagraphs`` (dynamo's CUDA graph
backend: the same CUDA graph trees over aot_eager's graphs, no Triton).

Then trains a copy of the initial model eagerly on the same batches. Prints
``compiled`` and ``eager`` with each run's losses, ``captures N`` (CUDA graph
captures during the compiled run) and ``done``.
"""

import copy
import sys

import torch


def losses_of(train_step, batches):
    out = []
    for x, y in batches:
        out.append(train_step(x, y).item())  # before the next replay overwrites it
    return out


def make_train_step(model, compile_how=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def train_step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    if compile_how == "reduce-overhead":
        return torch.compile(train_step, mode="reduce-overhead")
    if compile_how == "cudagraphs":
        return torch.compile(train_step, backend="cudagraphs")
    return train_step


def main():
    steps, how = int(sys.argv[1]), sys.argv[2]
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)
    ).to(device)
    reference = copy.deepcopy(model)
    batches = [
        (torch.randn(64, 256, device=device), torch.randint(0, 10, (64,), device=device))
        for _ in range(steps)
    ]
    captures = [0]
    capture_end = torch.cuda.CUDAGraph.capture_end

    def counted_capture_end(self, *args, **kwargs):
        captures[0] += 1
        return capture_end(self, *args, **kwargs)

    torch.cuda.CUDAGraph.capture_end = counted_capture_end
    compiled = losses_of(make_train_step(model, how), batches)
    torch.cuda.CUDAGraph.capture_end = capture_end
    eager = losses_of(make_train_step(reference), batches)
    torch.cuda.synchronize()
    print("compiled", " ".join(repr(v) for v in compiled))
    print("eager", " ".join(repr(v) for v in eager))
    print("captures", captures[0])
    print("done")


if __name__ == "__main__":
    main()
