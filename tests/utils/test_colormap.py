"""trainkit.utils.colormap: a fixed palette of distinct colours (BGR by default), random picks."""

import numpy as np
import pytest

from trainkit.utils.colormap import colormap, random_color, random_colors


def test_palette_is_distinct_scaled_and_bgr_by_default():
    rgb = colormap(rgb=True, maximum=1)
    assert rgb.dtype == np.float32 and rgb.ndim == 2 and rgb.shape[1] == 3
    assert len(np.unique(np.round(rgb, 3), axis=0)) == len(rgb) >= 32
    assert rgb.min() >= 0 and rgb.max() <= 1
    # neighbours differ clearly (golden-ratio hues), so consecutive labels are told apart
    assert np.abs(np.diff(rgb, axis=0)).max(axis=1).min() > 0.1
    np.testing.assert_allclose(colormap(maximum=1), rgb[:, ::-1])
    np.testing.assert_allclose(colormap(rgb=True), rgb * 255, rtol=1e-6)


def test_colormap_returns_a_fresh_array():
    colormap()[0] = -1
    assert colormap().min() >= 0


def test_random_color_is_a_palette_row_and_follows_the_generator():
    palette = colormap(rgb=True)
    color = random_color(rgb=True, rng=np.random.default_rng(3))
    assert color.shape == (3,)
    assert any(np.array_equal(color, row) for row in palette)
    again = random_color(rgb=True, rng=np.random.default_rng(3))
    np.testing.assert_array_equal(color, again)
    np.random.seed(5)
    first = random_color()
    np.random.seed(5)
    np.testing.assert_array_equal(first, random_color())  # the global generator by default


def test_random_colors_are_distinct_until_the_palette_is_used_up():
    size = len(colormap())
    colors = random_colors(size, rng=np.random.default_rng(0))
    assert len({tuple(c) for c in colors}) == size
    more = random_colors(size + 5, rng=np.random.default_rng(0))
    assert len(more) == size + 5 and len({tuple(c) for c in more}) == size
    assert random_colors(0) == []
    with pytest.raises(ValueError, match="N >= 0"):
        random_colors(-1)
