"""A fixed palette of distinguishable colours, and random picks from it (detectron2's colormap).

The palette is trainkit's own: hues a golden-ratio step apart, each at one of three
saturation/brightness levels, so neighbouring entries differ in hue and in shade. As in
detectron2, colours are BGR unless ``rgb=True``, and scaled to ``[0, maximum]``.
"""

from __future__ import annotations

import colorsys

import numpy as np

__all__ = ["colormap", "random_color", "random_colors"]

_NUM_COLORS = 64
_GOLDEN_RATIO_CONJUGATE = 0.618033988749895
# (saturation, value) levels, taken in turn.
_SHADES = ((0.85, 0.95), (0.55, 0.85), (0.95, 0.65))


# RGB in [0, 1]; a constant computed once (read-only).
_RGB = np.asarray(
    [
        colorsys.hsv_to_rgb((k * _GOLDEN_RATIO_CONJUGATE) % 1.0, *_SHADES[k % len(_SHADES)])
        for k in range(_NUM_COLORS)
    ],
    dtype=np.float32,
)
_RGB.setflags(write=False)


def _scaled(rgb: np.ndarray, use_rgb: bool, maximum: float) -> np.ndarray:
    colors = rgb if use_rgb else rgb[..., ::-1]
    return (colors * maximum).astype(np.float32)


def colormap(rgb: bool = False, maximum: float = 255) -> np.ndarray:
    """Return the palette: a float32 array of shape ``(64, 3)``, a fresh copy each call.

    Args:
        rgb: RGB channel order if true, else BGR (detectron2's default, for OpenCV).
        maximum: the value of a full channel: 255 for 8-bit images, 1 for matplotlib.
    """
    return _scaled(_RGB, rgb, maximum)


def random_color(
    rgb: bool = False, maximum: float = 255, *, rng: np.random.Generator | None = None
) -> np.ndarray:
    """Return one colour of the palette picked at random: a float32 array of shape ``(3,)``.

    Args:
        rgb, maximum: as in :func:`colormap`.
        rng: the generator to draw from; by default numpy's global one (``np.random``,
            which ``trainkit.utils.env.seed_all_rng`` seeds), as detectron2 does.
    """
    index = rng.integers(len(_RGB)) if rng is not None else np.random.randint(len(_RGB))
    return _scaled(_RGB[index], rgb, maximum)


def random_colors(
    N: int, rgb: bool = False, maximum: float = 255, *, rng: np.random.Generator | None = None
) -> list[np.ndarray]:
    """Return ``N`` colours of the palette in random order: all different while ``N <= 64``.

    Beyond 64 the palette repeats, each round in a new random order.

    Args:
        N: how many colours.
        rgb, maximum, rng: as in :func:`random_color`.
    """
    if N < 0:
        raise ValueError(f"random_colors needs N >= 0 colours, got {N}")
    rounds = -(-N // len(_RGB))
    permute = rng.permutation if rng is not None else np.random.permutation
    order = np.concatenate([permute(len(_RGB)) for _ in range(rounds)] or [np.zeros(0, int)])
    return [_scaled(_RGB[index], rgb, maximum) for index in order[:N]]
