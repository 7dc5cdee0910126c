"""Rendering of one synthetic ``shapes`` image: pure functions of (seed, index).

Kept apart from the file and catalog handling in :mod:`trainkit.data.datasets.shapes` so
that the picture itself is easy to read, test and change (changing it means bumping
``RENDER_VERSION``, which makes existing datasets regenerate).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from PIL import Image

__all__ = ["RENDER_VERSION", "SHAPES_CLASSES", "render_shape_image"]

# Bump when the pictures change: a dataset on disk made by another version is regenerated.
RENDER_VERSION = 1

SHAPES_CLASSES: tuple[str, ...] = ("circle", "square", "triangle", "star", "cross", "hexagon")

# Width and height are drawn independently from [MIN_SIDE_PX, MAX_SIDE_PX].
MIN_SIDE_PX = 48
MAX_SIDE_PX = 192

Point = tuple[float, float]


def _regular_polygon(
    cx: float, cy: float, radius: float, num_vertices: int, angle: float
) -> list[Point]:
    step = 2.0 * math.pi / num_vertices
    return [
        (cx + radius * math.cos(angle + k * step), cy + radius * math.sin(angle + k * step))
        for k in range(num_vertices)
    ]


def _star(cx: float, cy: float, radius: float, angle: float) -> list[Point]:
    points = []
    for k in range(10):
        r = radius if k % 2 == 0 else radius * 0.42
        a = angle + k * math.pi / 5.0
        points.append((cx + r * math.cos(a), cy + r * math.sin(a)))
    return points


def _cross(cx: float, cy: float, radius: float, angle: float) -> list[Point]:
    half_width = radius * 0.32
    # A plus sign traced around its 12 corners in its own frame, then rotated.
    outline = [
        (half_width, -radius), (half_width, -half_width), (radius, -half_width),
        (radius, half_width), (half_width, half_width), (half_width, radius),
        (-half_width, radius), (-half_width, half_width), (-radius, half_width),
        (-radius, -half_width), (-half_width, -half_width), (-half_width, -radius),
    ]  # fmt: skip
    cos_a, sin_a = math.cos(angle), math.sin(angle)
    return [(cx + x * cos_a - y * sin_a, cy + x * sin_a + y * cos_a) for x, y in outline]


_POLYGONS: dict[str, Callable[[float, float, float, float], list[Point]]] = {
    "square": lambda cx, cy, r, a: _regular_polygon(cx, cy, r, 4, a),
    "triangle": lambda cx, cy, r, a: _regular_polygon(cx, cy, r, 3, a),
    "star": _star,
    "cross": _cross,
    "hexagon": lambda cx, cy, r, a: _regular_polygon(cx, cy, r, 6, a),
}


def _contrasting_colour(rng: np.random.Generator, background: np.ndarray) -> tuple[int, ...]:
    # Redraw until the colour stands out from the background; 100 tries always suffice in
    # practice (about a third of uniform colours qualify), the last one is kept regardless.
    colour = background
    for _ in range(100):
        colour = rng.integers(0, 256, size=3)
        if np.linalg.norm(colour.astype(np.float64) - background) > 140:
            break
    return tuple(int(c) for c in colour)


def _background(
    rng: np.random.Generator, width: int, height: int
) -> tuple[Image.Image, np.ndarray]:
    base = rng.integers(0, 256, size=3)
    # Low-frequency colour blotches: a tiny random field upsampled to the image size.
    coarse = rng.normal(0.0, rng.uniform(5.0, 30.0), size=(4, 4, 3))
    field = np.clip(base + coarse, 0, 255).astype(np.uint8)
    from PIL import Image  # imported here: only generating the dataset needs it

    image = Image.fromarray(field, "RGB").resize((width, height), Image.BILINEAR)
    return image, base.astype(np.float64)


def render_shape_image(seed: int, index: int, label: int) -> Image.Image:
    """Draw image ``index`` of the split with ``seed``: one shape of ``SHAPES_CLASSES[label]``.

    The RGB image (each side in [48, 192] pixels) depends only on the arguments (a generator
    seeded by ``(seed, index)``), so a dataset can be regenerated bit for bit, in any order
    and by any number of processes.
    """
    from PIL import Image, ImageDraw  # imported here: only generating the dataset needs it

    rng = np.random.default_rng([seed, index])
    width, height = (int(v) for v in rng.integers(MIN_SIDE_PX, MAX_SIDE_PX + 1, size=2))
    image, background = _background(rng, width, height)
    draw = ImageDraw.Draw(image)

    # A few small distractor specks in random colours.
    for _ in range(int(rng.integers(0, 4))):
        x, y = rng.uniform(0, width), rng.uniform(0, height)
        speck_r = rng.uniform(1.0, 3.0)
        speck_colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        draw.ellipse((x - speck_r, y - speck_r, x + speck_r, y + speck_r), fill=speck_colour)

    short_side = min(width, height)
    radius = rng.uniform(0.25, 0.45) * short_side
    cx = rng.uniform(radius, width - radius)
    cy = rng.uniform(radius, height - radius)
    angle = rng.uniform(0.0, 2.0 * math.pi)
    colour = _contrasting_colour(rng, background)
    name = SHAPES_CLASSES[label]
    if name == "circle":
        draw.ellipse((cx - radius, cy - radius, cx + radius, cy + radius), fill=colour)
    else:
        draw.polygon(_POLYGONS[name](cx, cy, radius, angle), fill=colour)

    # Fine per-pixel noise over everything, shape included.
    noise_sigma = rng.uniform(2.0, 10.0)
    pixels = np.asarray(image, dtype=np.float32)
    pixels += rng.standard_normal(pixels.shape, dtype=np.float32) * noise_sigma
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
