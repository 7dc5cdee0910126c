"""Each built-in augmentation on images (uint8/float, HxW/HxWxC), label maps, boxes and points."""

import numpy as np
import pytest
import torch

from trainkit.data import MapDataset
from trainkit.data import transforms as T

H, W = 4, 6
GRID = (np.arange(H)[:, None] * 10 + np.arange(W)[None, :]).astype(np.uint8)
IMAGES = {
    "uint8_hw": GRID,
    "uint8_hwc": np.stack([GRID, GRID + 100, GRID + 200], axis=-1),
    "float_hw": GRID.astype(np.float32),
    "float_hwc": np.stack([GRID, GRID + 100, GRID + 200], axis=-1).astype(np.float32),
}
LABELS = (GRID % 3).astype(np.uint8)
BOX = np.array([[1.0, 1.0, 3.0, 2.0]])
POINT = np.array([[1.0, 2.0]])


def run(aug, image, seed=0, position=0):
    """Apply ``aug`` in a sample context; return (input after, transforms, points after)."""

    def mapper(_):
        aug_input = T.AugInput(image, sem_seg=LABELS, boxes=BOX.copy())
        tfms = T.AugmentationList([aug])(aug_input)
        return aug_input, tfms, tfms.apply_coords(POINT.copy())

    return MapDataset([None], mapper).map_at(0, seed=seed, position=position)


def first_position(aug, wanted, image=GRID):
    """A position at which ``aug`` chooses a transform of type ``wanted``."""
    for position in range(200):
        if isinstance(run(aug, image, position=position)[1][0], wanted):
            return position
    raise AssertionError(f"{aug} never chose {wanted.__name__}")


@pytest.mark.parametrize("kind", list(IMAGES))
def test_random_flip_moves_everything_or_nothing(kind):
    image = IMAGES[kind]
    flip = T.RandomFlip(prob=0.5)
    flipped, _, point = run(flip, image, position=first_position(flip, T.HFlipTransform))
    np.testing.assert_array_equal(flipped.image, image[:, ::-1])
    np.testing.assert_array_equal(flipped.sem_seg, LABELS[:, ::-1])
    np.testing.assert_allclose(flipped.boxes, [[3, 1, 5, 2]])
    np.testing.assert_allclose(point, [[5, 2]])
    kept, _, point = run(flip, image, position=first_position(flip, T.NoOpTransform))
    np.testing.assert_array_equal(kept.image, image)
    vertical = run(T.RandomFlip(1.0, horizontal=False, vertical=True), image)[0]
    np.testing.assert_array_equal(vertical.image, image[::-1])
    np.testing.assert_allclose(vertical.boxes, [[1, 2, 3, 3]])


def test_random_flip_probability_and_direction_checks():
    assert all(
        isinstance(run(T.RandomFlip(0.0), GRID, position=p)[1][0], T.NoOpTransform)
        for p in range(20)
    )
    with pytest.raises(ValueError, match="exactly one"):
        T.RandomFlip(horizontal=True, vertical=True)


@pytest.mark.parametrize("kind", list(IMAGES))
def test_resize_and_resize_shortest_edge(kind):
    image = IMAGES[kind]
    out, _, point = run(T.Resize((8, 12)), image)
    assert out.image.shape[:2] == (8, 12) and out.image.dtype == image.dtype
    np.testing.assert_allclose(out.boxes, [[2, 2, 6, 4]])
    np.testing.assert_allclose(point, [[2, 4]])
    assert out.sem_seg.shape == (8, 12) and set(np.unique(out.sem_seg)) <= {0, 1, 2}
    # Shorter side 4 -> 8 (x2); then a cap of 9 on the longer side: 6 * 2 = 12 -> 9 (x1.5).
    assert run(T.ResizeShortestEdge(8), image)[0].image.shape[:2] == (8, 12)
    capped, _, point = run(T.ResizeShortestEdge(8, max_size=9), image)
    assert capped.image.shape[:2] == (6, 9)
    np.testing.assert_allclose(point, [[1.5, 3]])


def test_resize_shortest_edge_sampling():
    assert T.ResizeShortestEdge.get_output_shape(4, 6, 8, 1000) == (8, 12)
    assert T.ResizeShortestEdge.get_output_shape(6, 4, 8, 10) == (10, 7)  # 12 -> 10, 8*10/12
    sizes = {
        run(T.ResizeShortestEdge((2, 4)), GRID, position=p)[0].image.shape[0] for p in range(40)
    }
    assert sizes == {2, 3, 4}
    chosen = {
        run(T.ResizeShortestEdge((2, 8), sample_style="choice"), GRID, position=p)[0].image.shape[0]
        for p in range(40)
    }
    assert chosen == {2, 8}
    assert isinstance(run(T.ResizeShortestEdge(0), GRID)[1][0], T.NoOpTransform)
    with pytest.raises(ValueError, match="min, max"):
        T.ResizeShortestEdge((1, 2, 3))
    with pytest.raises(ValueError, match="sample_style"):
        T.ResizeShortestEdge(3, sample_style="uniform")


def test_resize_shortest_edge_chooses_from_a_config_list():
    # LazyCall(ResizeShortestEdge)(short_edge_length=[...]) passes an omegaconf ListConfig,
    # which refuses numpy integers as indices.
    from omegaconf import ListConfig

    aug = T.ResizeShortestEdge(ListConfig([2, 8]), sample_style="choice")
    chosen = {run(aug, GRID, position=p)[0].image.shape[0] for p in range(40)}
    assert chosen == {2, 8}


def _scripted_resize(image):
    h, w = T.ResizeShortestEdge.get_output_shape(image.shape[-2], image.shape[-1], 6, 10)
    return torch.nn.functional.interpolate(image[None], size=(h, w))


def test_resize_shortest_edge_output_shape_works_in_torchscript():
    scripted = torch.jit.script(_scripted_resize)
    for shape in [(3, 4, 4), (3, 2, 30)]:
        image = torch.rand(shape)
        assert torch.equal(scripted(image), _scripted_resize(image))
    assert scripted(torch.rand(3, 2, 30)).shape[-2:] == (1, 10)  # capped at 10


def test_resize_scale_and_random_resize():
    # Target 8x8 at scale 1..1: fit a 4x6 image inside -> factor 8/6.
    out = run(T.ResizeScale(1.0, 1.0, 8, 8), GRID)[0]
    assert out.image.shape == (5, 8)
    shapes = {
        run(T.RandomResize([(2, 3), (8, 12)]), GRID, position=p)[0].image.shape for p in range(30)
    }
    assert shapes == {(2, 3), (8, 12)}


@pytest.mark.parametrize("kind", list(IMAGES))
def test_random_rotation(kind):
    image = IMAGES[kind]
    out, tfms, point = run(T.RandomRotation([90, 90], interp=0), image)
    np.testing.assert_array_equal(out.image, np.rot90(image))
    np.testing.assert_array_equal(out.sem_seg, np.rot90(LABELS))
    # Counter-clockwise about the centre, then shifted into the 6x4 output: (x, y) -> (y, 6 - x).
    np.testing.assert_allclose(point, [[2, 5]], atol=1e-9)
    np.testing.assert_allclose(out.boxes, [[1, 3, 2, 5]], atol=1e-9)
    assert isinstance(
        run(T.RandomRotation([0, 360], sample_style="choice"), image)[1][0], T.NoOpTransform
    )
    angles = {
        float(
            run(T.RandomRotation([10, 20, 30], sample_style="choice"), image, position=p)[1][
                0
            ].angle
        )
        for p in range(30)
    }
    assert angles == {10.0, 20.0, 30.0}
    centred = run(T.RandomRotation(90, expand=False, center=[0.0, 0.0]), image)[1][0]
    assert tuple(centred.center) == (0.0, 0.0)


@pytest.mark.parametrize("kind", list(IMAGES))
def test_random_crop_types(kind):
    image = IMAGES[kind]
    out, tfms, point = run(T.RandomCrop("absolute", (2, 3)), image)
    crop = tfms[0]
    assert out.image.shape[:2] == (2, 3)
    np.testing.assert_array_equal(out.image, image[crop.y0 : crop.y0 + 2, crop.x0 : crop.x0 + 3])
    np.testing.assert_array_equal(out.sem_seg, LABELS[crop.y0 : crop.y0 + 2, crop.x0 : crop.x0 + 3])
    np.testing.assert_allclose(point, POINT - [crop.x0, crop.y0])
    np.testing.assert_allclose(out.boxes, BOX - [crop.x0, crop.y0, crop.x0, crop.y0])
    assert run(T.RandomCrop("relative", (0.5, 0.5)), image)[0].image.shape[:2] == (2, 3)
    for p in range(20):
        h, w = run(T.RandomCrop("relative_range", (0.5, 0.5)), image, position=p)[0].image.shape[:2]
        assert 2 <= h <= 4 and 3 <= w <= 6
        h, w = run(T.RandomCrop("absolute_range", (2, 5)), image, position=p)[0].image.shape[:2]
        assert 2 <= h <= 4 and 2 <= w <= 5
    with pytest.raises(ValueError, match="INPUT.CROP.TYPE"):
        T.RandomCrop("square", (1, 1))


def test_category_area_constraint_avoids_crops_of_one_label():
    labels = np.zeros((4, 6), np.uint8)
    labels[:, 5] = 1  # one column of label 1: most 2-column crops are all 0
    aug = T.RandomCrop_CategoryAreaConstraint("absolute", (4, 2), single_category_max_area=0.9)

    def crop_x0(p):
        def mapper(_):
            return aug.get_transform(GRID, labels).x0

        return MapDataset([None], mapper).map_at(0, seed=0, position=p)

    # Only x0 = 4 mixes both labels; with 10 tries it is found almost always.
    assert sum(crop_x0(p) == 4 for p in range(30)) >= 20
    unconstrained = T.RandomCrop_CategoryAreaConstraint("absolute", (4, 2))
    assert isinstance(unconstrained.get_transform(GRID, labels), T.CropTransform)


@pytest.mark.parametrize("kind", list(IMAGES))
def test_fixed_size_crop_crops_and_pads(kind):
    image = IMAGES[kind]
    out = run(T.FixedSizeCrop((2, 8), pad_value=9, seg_pad_value=255), image)[0]
    assert out.image.shape[:2] == (2, 8)  # height cropped to 2, width padded to 8
    np.testing.assert_array_equal(out.image[:, 6:], 9)
    np.testing.assert_array_equal(out.sem_seg[:, 6:], 255)
    assert run(T.FixedSizeCrop((2, 8), pad=False), image)[0].image.shape[:2] == (2, 6)


def test_min_iou_random_crop_keeps_boxes_overlapping():
    image = np.zeros((40, 60, 3), np.uint8)
    boxes = np.array([[10.0, 10.0, 30.0, 30.0]])
    aug = T.MinIoURandomCrop(min_ious=(0.3,), min_crop_size=0.3)
    assert aug.sample_mode == (1, 0.3, 0)  # 1: keep the image; 0: any overlap
    aug.sample_mode = (1, 0.3)  # so that every crop must reach 0.3

    def mapper(_):
        return aug.get_transform(image, boxes)

    crops = [MapDataset([None], mapper).map_at(0, seed=1, position=p) for p in range(30)]
    kinds = {type(c).__name__ for c in crops}
    assert kinds <= {"CropTransform", "NoOpTransform"} and "CropTransform" in kinds
    for c in crops:
        if isinstance(c, T.CropTransform):
            moved = c.apply_box(boxes.copy())[0]
            inter = max(0, min(moved[2], c.w) - max(moved[0], 0)) * max(
                0, min(moved[3], c.h) - max(moved[1], 0)
            )
            union = 400 + c.w * c.h - inter
            assert inter / union >= 0.3 - 1e-6
            assert c.x0 < 20 < c.x0 + c.w and c.y0 < 20 < c.y0 + c.h  # holds the box's centre
    assert isinstance(aug.get_transform(image, None), T.NoOpTransform)


@pytest.mark.parametrize("kind", list(IMAGES))
def test_random_extent_crops_a_window(kind):
    image = IMAGES[kind]
    out, tfms, point = run(T.RandomExtent(scale_range=(0.5, 0.5), shift_range=(0, 0)), image)
    # Half the size, centred: x 1.5..4.5, y 1..3.
    assert out.image.shape[:2] == (2, 3)
    np.testing.assert_allclose(point, [[-0.5, 1]])
    assert out.sem_seg.shape == (2, 3)


@pytest.mark.parametrize("kind", list(IMAGES))
def test_colour_augmentations(kind):
    image = IMAGES[kind]
    dark = run(T.RandomBrightness(0.5, 0.5), image)[0]
    np.testing.assert_allclose(
        dark.image, (image.astype(np.float32) * 0.5).astype(image.dtype), atol=1
    )
    np.testing.assert_array_equal(dark.sem_seg, LABELS)
    np.testing.assert_allclose(dark.boxes, BOX)
    flat = run(T.RandomContrast(0.0, 0.0), image)[0]
    np.testing.assert_allclose(flat.image, np.full(image.shape, image.mean()), atol=1)
    same = run(T.RandomContrast(1.0, 1.0), image)[0]
    np.testing.assert_allclose(same.image, image, atol=1e-4)


def test_saturation_and_lighting_need_rgb():
    rgb = IMAGES["float_hwc"]
    grey = run(T.RandomSaturation(0.0, 0.0), rgb)[0].image
    expected = rgb.dot([0.299, 0.587, 0.114])
    for c in range(3):
        np.testing.assert_allclose(grey[:, :, c], expected, rtol=1e-5)
    lit = run(T.RandomLighting(0.0), rgb)[0].image  # no noise
    np.testing.assert_allclose(lit, rgb)
    with pytest.raises(ValueError, match="RGB"):
        T.RandomSaturation(0.5, 1.5).get_transform(GRID)
    with pytest.raises(ValueError, match="RGB"):
        T.RandomLighting(0.1).get_transform(GRID)


def test_random_apply_with_augmentation_or_transform():
    seen = {
        type(run(T.RandomApply(T.HFlipTransform(W), 0.5), GRID, position=p)[1][0]).__name__
        for p in range(30)
    }
    assert seen == {"HFlipTransform", "NoOpTransform"}
    always = run(T.RandomApply(T.Resize((2, 3)), prob=1.0), GRID)[0]
    assert always.image.shape == (2, 3)
    with pytest.raises(ValueError, match="prob"):
        T.RandomApply(T.RandomFlip(), 1.5)
