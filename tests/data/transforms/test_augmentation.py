"""Augmentation, AugInput, AugmentationList and where their random numbers come from."""

import numpy as np
import pytest

from trainkit.data import MapDataset
from trainkit.data import transforms as T
from trainkit.data.mapping.record_mapper import augmentation_rng

IMAGE = np.arange(24, dtype=np.uint8).reshape(4, 6)


class NeedsImageAndLabels(T.Augmentation):
    def get_transform(self, image, sem_seg):
        # Crop the columns where the label map is 1.
        cols = np.flatnonzero((sem_seg == 1).any(axis=0))
        return T.CropTransform(int(cols[0]), 0, int(cols[-1] - cols[0] + 1), image.shape[0])


def test_get_transform_arguments_are_read_from_the_input_by_name():
    labels = np.zeros((4, 6), np.uint8)
    labels[:, 2:4] = 1
    aug_input = T.AugInput(IMAGE, sem_seg=labels, boxes=np.array([[2.0, 0.0, 4.0, 2.0]]))
    tfm = NeedsImageAndLabels()(aug_input)
    assert isinstance(tfm, T.CropTransform)
    np.testing.assert_array_equal(aug_input.image, IMAGE[:, 2:4])
    np.testing.assert_array_equal(aug_input.sem_seg, 1)
    np.testing.assert_allclose(aug_input.boxes, [[0, 0, 2, 2]])
    with pytest.raises(AttributeError, match="needs 'sem_seg'"):
        NeedsImageAndLabels()(type("Bare", (), {"image": IMAGE})())


def test_a_plain_transform_in_a_list_is_applied_as_it_is():
    aug_input = T.AugInput(IMAGE)
    tfms = T.AugmentationList([T.HFlipTransform(6), T.Resize((2, 3))])(aug_input)
    assert isinstance(tfms, T.TransformList) and len(tfms) == 2
    assert isinstance(tfms[0], T.HFlipTransform)
    assert aug_input.image.shape == (2, 3)
    # The returned list moves points as the image moved: x -> 6 - x, then halved.
    np.testing.assert_allclose(tfms.apply_coords(np.array([[1.0, 2.0]])), [[2.5, 1.0]])


def test_apply_augmentations_on_an_array_and_on_an_input():
    image, tfms = T.apply_augmentations([T.VFlipTransform(4)], IMAGE)
    np.testing.assert_array_equal(image, IMAGE[::-1])
    aug_input = T.AugInput(IMAGE)
    same, tfms = T.apply_transform_gens([T.VFlipTransform(4)], aug_input)
    assert same is aug_input and isinstance(tfms, T.TransformList)
    assert T.StandardAugInput is T.AugInput and T.TransformGen is T.Augmentation


@pytest.mark.parametrize(
    "image, error",
    [
        (IMAGE.tolist(), TypeError),
        (IMAGE.astype(np.int32), TypeError),
        (IMAGE[None, None], ValueError),
    ],
    ids=["list", "int32", "4d"],
)
def test_aug_input_refuses_what_augmentations_cannot_take(image, error):
    with pytest.raises(error):
        T.AugInput(image)


def test_get_transform_must_return_a_transform():
    class Broken(T.Augmentation):
        def get_transform(self, image):
            return image

    with pytest.raises(TypeError, match="must return a Transform"):
        Broken()(T.AugInput(IMAGE))


def test_repr_shows_arguments_that_differ_from_defaults():
    assert repr(T.RandomFlip(0.3)) == "RandomFlip(prob=0.3)"
    assert (
        repr(T.ResizeShortestEdge(32, 64))
        == "ResizeShortestEdge(short_edge_length=(32, 32), max_size=64)"
    )
    listed = T.AugmentationList([T.RandomFlip(), T.HFlipTransform(3)])
    assert str(listed).startswith("AugmentationList[RandomFlip(), HFlipTransform")


def test_outside_a_loader_draws_follow_numpys_global_seed():
    flip = T.RandomFlip()
    np.random.seed(3)
    first = [type(flip.get_transform(IMAGE)).__name__ for _ in range(20)]
    np.random.seed(3)
    again = [type(flip.get_transform(IMAGE)).__name__ for _ in range(20)]
    assert first == again and {"HFlipTransform", "NoOpTransform"} == set(first)


def test_inside_a_loader_draws_come_from_the_samples_generator():
    def draws(_):
        return [float(augmentation_rng().random()), float(T.RandomFlip()._rand_range())]

    dataset = MapDataset([None] * 4, draws)
    np.random.seed(0)
    first = dataset.map_at(0, seed=5, position=2)
    np.random.seed(1)  # the global generator does not matter inside a sample
    assert dataset.map_at(0, seed=5, position=2) == first
    assert dataset.map_at(0, seed=5, position=3) != first
    assert first[0] != first[1]  # successive draws continue one generator
