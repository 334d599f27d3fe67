"""Synthetic handwritten-looking digits, MNIST-shaped, drawn on the fly (numpy only).

Each of the ten classes is a glyph made of pen strokes (polylines in a unit
box). A sample is its glyph under a random affine transform (rotation, scale,
shear, shift), drawn with a random pen width, plus background noise and a few
faint blobs. The same seed gives the same data set, so a demo run is
reproducible; the classes differ in shape only, so a small CNN has to learn
strokes, as on MNIST, and its loss falls within a few hundred steps.

This module knows nothing about trainmedic or torch: the demo's training
script imports it as a sibling file, and the demo writes data sets with it.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import numpy.typing as npt

SIDE = 28
"""Image side, pixels (MNIST's 28 x 28)."""
CLASSES = 10

Strokes = list[list[tuple[float, float]]]


def _arc(
    cx: float, cy: float, rx: float, ry: float, a0: float, a1: float, n: int = 10
) -> list[tuple[float, float]]:
    """Points on an ellipse from angle ``a0`` to ``a1`` (degrees, y pointing down)."""
    return [
        (
            cx + rx * math.cos(math.radians(a0 + (a1 - a0) * i / (n - 1))),
            cy + ry * math.sin(math.radians(a0 + (a1 - a0) * i / (n - 1))),
        )
        for i in range(n)
    ]


# Glyphs in a unit box: x to the right, y downwards, strokes as polylines.
GLYPHS: tuple[Strokes, ...] = (
    [_arc(0.5, 0.5, 0.28, 0.4, 0, 360, 16)],
    [[(0.35, 0.25), (0.55, 0.1), (0.55, 0.9)], [(0.35, 0.9), (0.72, 0.9)]],
    [[*_arc(0.5, 0.32, 0.25, 0.22, 200, 360, 8), (0.25, 0.9), (0.78, 0.9)]],
    [_arc(0.48, 0.3, 0.24, 0.2, 210, 450, 9), _arc(0.48, 0.7, 0.27, 0.2, 270, 510, 9)],
    [[(0.62, 0.9), (0.62, 0.1), (0.22, 0.65), (0.8, 0.65)]],
    [[(0.75, 0.1), (0.3, 0.1), (0.27, 0.45)], _arc(0.48, 0.65, 0.27, 0.25, 240, 480, 10)],
    [[(0.68, 0.1), (0.33, 0.5)], _arc(0.5, 0.68, 0.24, 0.22, 0, 360, 12)],
    [[(0.22, 0.1), (0.78, 0.1), (0.42, 0.9)], [(0.35, 0.5), (0.68, 0.5)]],
    [_arc(0.5, 0.3, 0.2, 0.19, 0, 360, 12), _arc(0.5, 0.7, 0.25, 0.21, 0, 360, 12)],
    [_arc(0.5, 0.32, 0.24, 0.22, 0, 360, 12), [(0.74, 0.32), (0.6, 0.9)]],
)


def _segments(glyph: Strokes) -> npt.NDArray[np.float64]:
    """The glyph's line segments, shape (segments, 2 ends, 2 coordinates)."""
    segs = [(a, b) for stroke in glyph for a, b in itertools.pairwise(stroke)]
    return np.asarray(segs, dtype=np.float64)


TEMPLATE_SIDE = 64
"""Side of the glyph templates, pixels: fine enough that warping them stays smooth."""
PEN_WIDTHS = (0.05, 0.075, 0.1)
"""Pen widths of the templates, in units of the glyph box."""


def _render(segments: npt.NDArray[np.float64], pen: float) -> npt.NDArray[np.float32]:
    """Ink (0..1) of one glyph drawn with pen width ``pen`` on the template grid."""
    c = (np.arange(TEMPLATE_SIDE) + 0.5) / TEMPLATE_SIDE
    pix = np.stack(np.meshgrid(c, c, indexing="xy"), axis=-1).reshape(-1, 2)  # (pixels, 2)
    a = segments[:, None, 0, :]
    ab = segments[:, None, 1, :] - a
    ap = pix[None, :, :] - a
    t = np.clip((ap * ab).sum(-1) / np.maximum((ab * ab).sum(-1), 1e-12), 0.0, 1.0)
    dist = np.linalg.norm(ap - t[..., None] * ab, axis=-1).min(axis=0)
    soft = 1.5 / TEMPLATE_SIDE  # one and a half template pixels of anti-aliasing
    ink: npt.NDArray[np.float64] = np.clip((pen / 2 + soft - dist) / soft, 0.0, 1.0)
    return ink.reshape(TEMPLATE_SIDE, TEMPLATE_SIDE).astype(np.float32)


_templates: npt.NDArray[np.float32] | None = None


def templates() -> npt.NDArray[np.float32]:
    """Every glyph in every pen width, shape (classes, pens, side, side); made once."""
    global _templates
    if _templates is None:
        _templates = np.stack(
            [np.stack([_render(_segments(g), w) for w in PEN_WIDTHS]) for g in GLYPHS]
        )
    return _templates


def make_digits(count: int, seed: int = 0) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """``count`` images (uint8, shape (count, 1, 28, 28)) and their labels (0..9).

    Classes are balanced and shuffled; the same ``seed`` gives the same arrays.
    """
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(count) % CLASSES).astype(np.int64)
    images = np.empty((count, 1, SIDE, SIDE), dtype=np.uint8)
    chunk = 4096  # bounds the working arrays to ~100 MB
    for start in range(0, count, chunk):
        stop = min(count, start + chunk)
        images[start:stop, 0] = _draw(labels[start:stop], rng)
    return images, labels


def _draw(labels: npt.NDArray[np.int64], rng: np.random.Generator) -> npt.NDArray[np.uint8]:
    """Warp each label's template by a random affine map into a 28 x 28 image."""
    n = len(labels)
    tpl = templates()
    pens = rng.integers(0, len(PEN_WIDTHS), n)
    # The glyph box maps to about 20 x 20 pixels centred in the image, as MNIST's
    # digits do; rotation, anisotropic scale, shear and shift vary per sample.
    angle = rng.uniform(-0.3, 0.3, n)
    sx = rng.uniform(0.8, 1.1, n) * rng.uniform(0.85, 1.15, n)
    sy = rng.uniform(0.8, 1.1, n)
    shear = rng.uniform(-0.3, 0.3, n)
    shift = rng.uniform(-2.0, 2.0, (n, 2))
    cos, sin = np.cos(angle), np.sin(angle)
    m = np.empty((n, 2, 2))
    m[:, 0, 0] = cos * sx
    m[:, 0, 1] = (shear * cos - sin) * sy
    m[:, 1, 0] = sin * sx
    m[:, 1, 1] = (shear * sin + cos) * sy
    inv = np.linalg.inv(m * 20.0)
    c = np.arange(SIDE) + 0.5
    pix = np.stack(np.meshgrid(c, c, indexing="xy"), axis=-1).reshape(-1, 2)  # (784, 2)
    rel = pix[None] - SIDE / 2.0 - shift[:, None, :]  # (n, 784, 2)
    src = (np.einsum("nij,npj->npi", inv, rel) + 0.5) * TEMPLATE_SIDE - 0.5
    ink = _bilinear(tpl.reshape(-1), labels * len(PEN_WIDTHS) + pens, src[..., 0], src[..., 1])
    # Faint blobs and sensor noise: the background is never clean, as in scans.
    for _ in range(2):
        centre = rng.uniform(0, SIDE, (n, 1, 2))
        radius = rng.uniform(1.0, 2.5, (n, 1))
        d = np.linalg.norm(pix[None] - centre, axis=-1)
        ink = np.maximum(ink, 0.35 * np.clip(radius - d, 0.0, 1.0))
    ink = ink + rng.normal(0.0, 0.08, ink.shape)
    return (np.clip(ink, 0.0, 1.0) * 255).astype(np.uint8).reshape(n, SIDE, SIDE)


def _bilinear(
    flat: npt.NDArray[np.float32],
    which: npt.NDArray[np.int64],
    x: npt.NDArray[np.float64],
    y: npt.NDArray[np.float64],
) -> npt.NDArray[np.float64]:
    """Templates sampled bilinearly, zero outside: sample ``k`` reads template
    ``which[k]`` of ``flat`` (all templates, raveled) at (``x[k]``, ``y[k]``)."""
    side = TEMPLATE_SIDE
    x0 = np.floor(x).astype(np.int64)
    y0 = np.floor(y).astype(np.int64)
    fx, fy = x - x0, y - y0
    base = (which * side * side)[:, None]
    out = np.zeros(x.shape)
    for dy, wy in ((0, 1.0 - fy), (1, fy)):
        for dx, wx in ((0, 1.0 - fx), (1, fx)):
            xi, yi = x0 + dx, y0 + dy
            inside = (xi >= 0) & (xi < side) & (yi >= 0) & (yi < side)
            vals = flat[base + np.clip(yi, 0, side - 1) * side + np.clip(xi, 0, side - 1)]
            out += np.where(inside, vals * wx * wy, 0.0)
    return out


def write_digits(directory: Path, count: int, seed: int = 0) -> int:
    """Write ``count`` samples to ``directory``, one ``.npy`` file per sample.

    File ``{i:06d}_{label}.npy`` holds image ``i`` (uint8, 1 x 28 x 28); the
    label is in the name, as in folder-per-class image sets. Returns the bytes
    written.
    """
    images, labels = make_digits(count, seed)
    directory.mkdir(parents=True, exist_ok=True)
    total = 0
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        path = directory / f"{i:06d}_{int(label)}.npy"
        np.save(path, image)
        total += path.stat().st_size
    return total
