"""Input-bound training without a DataLoader: the loop builds every batch itself.

An ordinary script, not written for any tool: each step turns synthetic
"sentences" into bag-of-words vectors in pure Python (tokenise, count,
normalise), then trains a linear classifier on them. The batch preparation
runs in series with the step, on one core.

    python manual_batches.py --steps 80
"""

import argparse
import random

import torch
from torch import nn

VOCAB = [f"w{i}" for i in range(2000)]


def make_sentence(rng, label):
    words = [rng.choice(VOCAB) for _ in range(120)]
    words += [f"w{label * 50 + rng.randrange(50)}" for _ in range(20)]
    rng.shuffle(words)
    return " ".join(words)


def featurize(sentence):
    counts = [0.0] * len(VOCAB)
    for token in sentence.split():
        counts[int(token[1:])] += 1.0
    total = sum(counts)
    return [c / total for c in counts]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    rng = random.Random(0)
    torch.manual_seed(0)
    model = nn.Linear(len(VOCAB), 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(1, args.steps + 1):
        labels = [rng.randrange(10) for _ in range(args.batch_size)]
        x = torch.tensor([featurize(make_sentence(rng, c)) for c in labels])
        y = torch.tensor(labels)
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        if step % 20 == 0:
            print(f"step {step} loss {loss.item():.3f}", flush=True)


if __name__ == "__main__":
    main()
