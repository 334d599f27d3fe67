"""The synthetic digits: MNIST-shaped, reproducible, balanced, and learnable."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from trainmedic.demo.digits import CLASSES, SIDE, make_digits, write_digits


def test_digits_are_mnist_shaped_uint8_with_balanced_labels() -> None:
    images, labels = make_digits(200, seed=3)
    assert images.shape == (200, 1, SIDE, SIDE) == (200, 1, 28, 28)
    assert images.dtype == np.uint8
    assert labels.dtype == np.int64
    assert sorted(np.bincount(labels, minlength=CLASSES).tolist()) == [20] * 10
    # Strokes on a dark, noisy background: some ink, mostly background.
    ink = (images > 128).mean()
    assert 0.05 < ink < 0.4


def test_same_seed_same_data_other_seed_other_data() -> None:
    a, la = make_digits(64, seed=1)
    b, lb = make_digits(64, seed=1)
    c, _ = make_digits(64, seed=2)
    assert np.array_equal(a, b) and np.array_equal(la, lb)
    assert not np.array_equal(a, c)


def test_classes_differ_by_shape_so_a_simple_classifier_learns_them() -> None:
    # Nearest class mean on held-out samples: far above chance (10 %) only if
    # each class has a shape of its own despite the random warps and noise.
    images, labels = make_digits(2000, seed=0)
    x = images.reshape(len(images), -1).astype(np.float64) / 255.0
    train, test = slice(0, 1500), slice(1500, 2000)
    means = np.stack([x[train][labels[train] == c].mean(0) for c in range(CLASSES)])
    predicted = ((x[test][:, None, :] - means[None]) ** 2).sum(-1).argmin(1)
    assert (predicted == labels[test]).mean() > 0.5


def test_samples_within_a_class_vary() -> None:
    images, labels = make_digits(100, seed=0)
    sevens = images[labels == 7].reshape(-1, SIDE * SIDE).astype(np.int64)
    assert len({row.tobytes() for row in sevens}) == len(sevens)


def test_write_digits_writes_one_npy_file_per_sample_with_the_label_in_its_name(
    tmp_path: Path,
) -> None:
    written = write_digits(tmp_path / "d", 30, seed=5)
    files = sorted((tmp_path / "d").glob("*.npy"))
    assert len(files) == 30
    assert written == sum(f.stat().st_size for f in files)
    images, labels = make_digits(30, seed=5)
    for i, f in enumerate(files):
        index, label = f.stem.split("_")
        assert int(index) == i and int(label) == labels[i]
        assert np.array_equal(np.load(f), images[i])
