"""``trainmedic demo``: a bundled example run, diagnosed end to end.

An ordinary training script (``train_lenet.py``: the LeNet of the article the
project started from, on synthetic MNIST-shaped digits drawn by ``digits.py``)
runs under ``trainmedic run`` in one of several scenarios
(:mod:`trainmedic.demo.scenarios`), each reproducing a real cause of slow
training on a CPU, or on a simulated GPU (``simulations/``).
:func:`trainmedic.demo.verdict.judge` says whether the diagnosis named it.
"""
