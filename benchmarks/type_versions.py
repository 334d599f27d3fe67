"""What changing a class over and over costs the calls on its instances, per Python version.

The probe's forward watch changes classes: ``nn.Module.__call__`` twice per
discovery, a root model class's ``__call__`` twice per window of the compute
hooks. From Python 3.13 CPython gives a class at most 1,000 attribute-cache
version tags (``MAX_VERSIONS_PER_CLASS``), a new one after each change of the
class or a base; past that its lookups are never cached or specialised again.
This times a call of a small module-like class (``__call__`` -> ``forward``,
two attribute reads) after the class was changed and changed back ``N``
times, each change followed by a call (which re-tags it), as the windows do:

* ``switch``: every change made, as the watch did before its budget;
* ``budget``: the changes stop at the watch's budget
  (``trainmedic.probe.forward.TYPE_CHANGE_BUDGET``, 400 from 3.13), the
  wrapper then staying on and passing calls through.

Any interpreter (no torch, no trainmedic needed: the budget is given):

    python benchmarks/type_versions.py [--changes 0,600,2000] [--budget 400]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def make_classes() -> tuple[type, type]:
    class Module:
        def __init__(self) -> None:
            self.w = 1.0
            self.b = 2.0

        def forward(self, x: float) -> float:
            return x * self.w + self.b

        def __call__(self, x: float) -> float:
            return self.forward(x)

    class Net(Module):
        pass

    return Module, Net


def ns_per_call(obj: object, calls: int = 200_000, repeats: int = 5) -> float:
    """Median over ``repeats`` of the mean time of one call of ``obj(1.0)``, ns."""
    timings = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            obj(1.0)  # type: ignore[operator]
        timings.append((time.perf_counter() - t0) / calls * 1e9)
    return statistics.median(timings)


def run(changes: int, budget: int | None) -> float:
    module, net = make_classes()
    obj = net()

    def wrapper(self: object, x: float) -> float:
        return module.__call__(self, x)  # type: ignore[arg-type]

    made = 0
    for _ in range(changes // 2):
        if budget is not None and made + 2 > budget:
            break  # past the budget the wrapper stays (here: the class as it is)
        net.__call__ = wrapper  # type: ignore[attr-defined]
        obj(1.0)  # type: ignore[operator]
        del net.__call__  # type: ignore[attr-defined]
        obj(1.0)  # type: ignore[operator]
        made += 2
    ns_per_call(obj, calls=20_000, repeats=1)  # warm: specialise again
    return ns_per_call(obj)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--changes", default="0,600,1200,4000")
    parser.add_argument("--budget", type=int, default=400)
    args = parser.parse_args()
    counts = [int(c) for c in args.changes.split(",")]
    print(f"Python {sys.version.split()[0]}: ns per call after N changes of the class")
    print("| changes | every change made | held to the budget |")
    print("|---|---|---|")
    base = run(0, None)
    for n in counts:
        switch = run(n, None)
        held = run(n, args.budget)
        print(
            f"| {n} | {switch:.0f} ns ({switch / base:.2f}x) | {held:.0f} ns ({held / base:.2f}x) |"
        )


if __name__ == "__main__":
    main()
