"""The transforms trainkit writes itself (resize, rotation, extent, colour) on every input kind."""

import numpy as np
import pytest
from PIL import Image, ImageEnhance

from trainkit.data import transforms as T

# A 4x6 image (h x w) whose pixel (y, x) holds 10 * y + x: where a pixel lands is readable.
GRID = (np.arange(4)[:, None] * 10 + np.arange(6)[None, :]).astype(np.uint8)


def images(base=GRID):
    """The same picture as uint8/float, HxW/HxWxC (C=3 and C=2: the per-channel path)."""
    return {
        "uint8_hw": base,
        "uint8_hwc": np.stack([base, base + 100, base + 200], axis=-1).astype(np.uint8),
        "uint8_hw2": np.stack([base, base + 1], axis=-1).astype(np.uint8),
        "float_hw": base.astype(np.float32),
        "float_hwc": np.stack([base, base + 100, base + 200], axis=-1).astype(np.float64),
    }


@pytest.mark.parametrize("kind", list(images()))
def test_resize_doubles_every_pixel_with_nearest(kind):
    img = images()[kind]
    out = T.ResizeTransform(4, 6, 8, 12, interp=Image.NEAREST).apply_image(img)
    assert out.shape == (8, 12, *img.shape[2:]) and out.dtype == img.dtype
    np.testing.assert_array_equal(out, img.repeat(2, axis=0).repeat(2, axis=1))


@pytest.mark.parametrize("kind", ["uint8_hwc", "float_hw"])
def test_resize_bilinear_of_a_flat_image_stays_flat(kind):
    img = np.full_like(images()[kind], 77)
    out = T.ResizeTransform(4, 6, 3, 5).apply_image(img)
    assert out.shape[:2] == (3, 5)
    np.testing.assert_allclose(out, 77, atol=1e-4)


def test_resize_points_boxes_segmentation_and_inverse():
    tfm = T.ResizeTransform(4, 6, 8, 3)
    np.testing.assert_allclose(
        tfm.apply_coords(np.array([[6.0, 4.0], [2.0, 1.0]])), [[3, 8], [1, 2]]
    )
    np.testing.assert_allclose(tfm.apply_box(np.array([[0.0, 0.0, 6.0, 2.0]])), [[0, 0, 3, 4]])
    labels = np.array([[1, 1, 2, 2, 3, 3]] * 4, dtype=np.int64)  # non-uint8 labels too
    seg = tfm.apply_segmentation(labels)
    assert seg.dtype == np.int64 and set(np.unique(seg)) <= {1, 2, 3}  # never blended
    np.testing.assert_array_equal(seg[0], [1, 2, 3])
    back = tfm.inverse()
    assert (back.h, back.w, back.new_h, back.new_w) == (8, 3, 4, 6)


def test_resize_refuses_an_image_of_another_size():
    with pytest.raises(ValueError, match="4x6"):
        T.ResizeTransform(4, 6, 2, 3).apply_image(np.zeros((5, 6), np.uint8))


@pytest.mark.parametrize("kind", list(images()))
def test_rotation_by_90_moves_pixels_as_the_points_move(kind):
    img = images()[kind]
    tfm = T.RotationTransform(4, 6, 90, interp=Image.NEAREST)
    out = tfm.apply_image(img)
    assert out.shape[:2] == (6, 4) and out.dtype == img.dtype  # expanded: sides swap
    # Counter-clockwise: the top row becomes the left column, read bottom to top.
    np.testing.assert_array_equal(out, np.rot90(img))
    # Pixel (x=2, y=1) has its centre at (2.5, 1.5); the point follows the pixel.
    x, y = tfm.apply_coords(np.array([[2.5, 1.5]]))[0]
    assert (int(y), int(x)) == (3, 1)
    assert np.all(out[3, 1] == img[1, 2])


def test_rotation_boxes_segmentation_no_expand_and_inverse():
    tfm = T.RotationTransform(4, 6, 90)
    # A box around the whole image becomes the whole rotated image.
    whole = tfm.apply_box(np.array([[0.0, 0.0, 6.0, 4.0]]))
    np.testing.assert_allclose(whole, [[0, 0, 4, 6]], atol=1e-9)
    seg = tfm.apply_segmentation(GRID)
    np.testing.assert_array_equal(seg, np.rot90(GRID))
    kept = T.RotationTransform(4, 6, 180, expand=False)
    np.testing.assert_array_equal(kept.apply_image(GRID, interp=Image.NEAREST), GRID[::-1, ::-1])
    with pytest.raises(NotImplementedError):
        kept.inverse()
    nearest = T.RotationTransform(4, 6, 90, interp=Image.NEAREST)
    round_trip = nearest.inverse().apply_image(nearest.apply_image(GRID))
    np.testing.assert_array_equal(round_trip, GRID)
    assert T.RotationTransform(4, 6, 360).apply_image(GRID) is GRID


@pytest.mark.parametrize("kind", list(images()))
def test_extent_crops_and_scales(kind):
    img = images()[kind]
    # The right half (x 3..6), all rows, scaled to 4 x 3: the crop itself.
    tfm = T.ExtentTransform(src_rect=(3, 0, 6, 4), output_size=(4, 3), interp=Image.NEAREST)
    out = tfm.apply_image(img)
    np.testing.assert_array_equal(out, img[:, 3:])
    np.testing.assert_allclose(
        tfm.apply_coords(np.array([[3.0, 0.0], [6.0, 4.0]])), [[0, 0], [3, 4]]
    )
    np.testing.assert_allclose(tfm.apply_box(np.array([[4.0, 1.0, 5.0, 2.0]])), [[1, 1, 2, 2]])


def test_extent_outside_the_image_is_filled_with_zeros():
    tfm = T.ExtentTransform(src_rect=(-6, 0, 6, 4), output_size=(4, 12), interp=Image.NEAREST)
    out = tfm.apply_segmentation(GRID + 1)
    np.testing.assert_array_equal(out[:, :6], 0)
    np.testing.assert_array_equal(out[:, 6:], GRID + 1)


def test_color_transforms_change_pixels_only():
    tfm = T.ColorTransform(lambda im: 255 - im)
    np.testing.assert_array_equal(tfm.apply_image(GRID), 255 - GRID)
    points = np.array([[1.0, 2.0]])
    np.testing.assert_array_equal(tfm.apply_coords(points.copy()), points)
    np.testing.assert_array_equal(tfm.apply_segmentation(GRID), GRID)
    assert isinstance(tfm.inverse(), T.NoOpTransform)
    with pytest.raises(ValueError, match="callable"):
        T.ColorTransform(3)
    rgb = images()["uint8_hwc"]
    pil = T.PILColorTransform(lambda im: ImageEnhance.Brightness(im).enhance(0.0))
    np.testing.assert_array_equal(pil.apply_image(rgb), 0)


def test_fvcore_transforms_are_the_same_classes():
    from fvcore.transforms import transform as F

    for name in ("Transform", "TransformList", "NoOpTransform", "HFlipTransform", "VFlipTransform",
                 "CropTransform", "PadTransform", "BlendTransform", "ScaleTransform"):  # fmt: skip
        assert getattr(T, name) is getattr(F, name)


def test_rotated_boxes_follow_flips_and_resizes():
    boxes = np.array([[4.0, 4.0, 2.0, 1.0, 0.0], [4.0, 4.0, 2.0, 1.0, 90.0]])
    resized = T.ResizeTransform(10, 10, 10, 20).apply_rotated_box(boxes.copy())  # x * 2
    # Along the x axis the width doubles; turned by 90 degrees the height does.
    np.testing.assert_allclose(resized, [[8, 4, 4, 1, 0], [8, 4, 2, 2, 90]], atol=1e-9)
    flipped = T.HFlipTransform(10).apply_rotated_box(boxes.copy())
    np.testing.assert_allclose(flipped, [[6, 4, 2, 1, 0], [6, 4, 2, 1, -90]])
    both = T.TransformList([T.HFlipTransform(10), T.NoOpTransform()])
    np.testing.assert_allclose(both.apply_rotated_box(boxes.copy()), flipped)
