"""A whole training step captured as one CUDA graph, as PyTorch's documentation shows
(torch.cuda.graph, "whole network capture"); not written for trainmedic.

Arguments: replays. Prints the loss after each block of replays and "replays N".
"""

import sys

import torch


def main():
    replays = int(sys.argv[1])
    torch.manual_seed(0)
    n, d_in, h, d_out = 640, 1024, 1024, 256
    model = torch.nn.Sequential(
        torch.nn.Linear(d_in, h), torch.nn.ReLU(), torch.nn.Linear(h, d_out)
    ).cuda()
    loss_fn = torch.nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    static_input = torch.randn(n, d_in, device="cuda")
    static_target = torch.randn(n, d_out, device="cuda")

    # Warm up on a side stream (required before capture).
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(static_input), static_target)
            loss.backward()
            optimizer.step()
    torch.cuda.current_stream().wait_stream(s)

    g = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        static_loss = loss_fn(model(static_input), static_target)
        static_loss.backward()
        optimizer.step()

    data = torch.randn(n, d_in, device="cuda")
    target = torch.randn(n, d_out, device="cuda")
    for i in range(replays):
        static_input.copy_(data)
        static_target.copy_(target)
        g.replay()
        if (i + 1) % 10 == 0:
            print(f"loss {static_loss.item():.6f}")
    torch.cuda.synchronize()
    print("replays", replays)


if __name__ == "__main__":
    main()
