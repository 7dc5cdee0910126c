"""detectron2 patterns with trainkit's transforms: custom augmentations written the
detectron2 way (np.random in get_transform, _rand_range, a plain Transform in the list)."""

import numpy as np

from trainkit.data import MapDataset
from trainkit.data import detection_utils as utils
from trainkit.data import transforms as T
from trainkit.data.transforms.augmentation import Augmentation, AugmentationList
from trainkit.data.transforms.augmentation_impl import RandomFlip, ResizeShortestEdge
from trainkit.data.transforms.transform import ResizeTransform


class RandomInvert(T.Augmentation):
    """A project's own augmentation, drawing from np.random as detectron2 code does."""

    def __init__(self, prob=0.5):
        super().__init__()
        self._init(locals())

    def get_transform(self, image):
        if np.random.rand() < self.prob:
            return T.ColorTransform(lambda img: 255 - img)
        return T.NoOpTransform()


def pipeline(image):
    augs = [
        ResizeShortestEdge([8, 12], max_size=20, sample_style="range"),
        RandomFlip(),
        RandomInvert(),
        T.RandomApply(T.RandomContrast(0.5, 1.5), prob=0.5),
    ]
    aug_input = T.AugInput(image, sem_seg=np.zeros(image.shape[:2], np.uint8))
    transforms = AugmentationList(augs)(aug_input)
    return aug_input.image, transforms


def test_detectron2_style_pipeline_is_repeatable_in_a_loader():
    image = np.tile(np.arange(10, dtype=np.uint8)[None, :, None], (6, 1, 3))
    dataset = MapDataset([image] * 4, lambda img: pipeline(img)[0].tobytes())
    first = [dataset.map_at(i, seed=2, position=p) for i, p in enumerate(range(10, 14))]
    again = [dataset.map_at(i, seed=2, position=p) for i, p in enumerate(range(10, 14))]
    assert first == again and len(set(first)) > 1


def test_transform_list_moves_other_data():
    image = np.zeros((6, 10, 3), np.uint8)
    new_image, transforms = T.apply_transform_gens(
        [ResizeShortestEdge(12), T.HFlipTransform(20)], image
    )
    assert new_image.shape == (12, 20, 3)
    assert isinstance(transforms[0], ResizeTransform) and issubclass(RandomInvert, Augmentation)
    np.testing.assert_allclose(transforms.apply_coords(np.array([[1.0, 1.0]])), [[18, 2]])


def test_build_augmentation_matches_detectron2_defaults():
    from trainkit.config import get_cfg

    cfg = get_cfg()  # detectron2's INPUT defaults: shorter side 800 (choice), cap 1333
    resize, flip = utils.build_augmentation(cfg, is_train=True)
    assert resize.short_edge_length == (800,) and resize.max_size == 1333 and not resize.is_range
    assert isinstance(flip, T.RandomFlip) and flip.prob == 0.5 and flip.horizontal
