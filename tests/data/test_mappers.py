"""ClassificationDatasetMapper: reading, size caps and reproducible augmentation."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from trainkit.config import get_cfg
from trainkit.data import MapDataset
from trainkit.data.mapping.mappers import ClassificationDatasetMapper


@pytest.fixture
def record(tmp_path):
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(50, 160, 3), dtype=np.uint8)  # 160 wide, 50 high
    path = tmp_path / "img.png"
    Image.fromarray(pixels, "RGB").save(path)
    return {"file_name": str(path), "height": 50, "width": 160, "label": 3, "image_id": 7}


def test_test_mapper_caps_the_longest_side(record):
    out = ClassificationDatasetMapper(is_train=False, max_size_test=64)(record)
    assert tuple(out["image"].shape) == (3, 20, 64)
    assert out["label"] == 3 and out["image_id"] == 7
    # The record's size (the original one) is reported, not the resized one.
    assert (out["height"], out["width"]) == (50, 160)
    uncapped = ClassificationDatasetMapper(is_train=False, max_size_test=0)(record)
    assert tuple(uncapped["image"].shape) == (3, 50, 160)
    larger_cap = ClassificationDatasetMapper(is_train=False, max_size_test=500)(record)
    assert tuple(larger_cap["image"].shape) == (3, 50, 160)  # small images are not enlarged


def test_train_mapper_caps_without_randomness(record):
    mapper = ClassificationDatasetMapper(is_train=True, max_size_train=80)
    # No flip and no rescale: usable outside a loader (no sample context needed).
    assert tuple(mapper(record)["image"].shape) == (3, 25, 80)


def test_train_mapper_rescales_the_capped_size_reproducibly(record):
    mapper = ClassificationDatasetMapper(
        is_train=True, flip_prob=0.5, scale_range=(0.5, 1.0), max_size_train=80
    )
    shapes = []
    mapped = MapDataset([record], mapper)  # maps in the sample context a loader gives
    for position in range(20):
        first = mapped.map_at(0, seed=0, position=position)["image"]
        again = mapped.map_at(0, seed=0, position=position)["image"]
        assert np.array_equal(first.numpy(), again.numpy())
        shapes.append(tuple(first.shape))
    widths = {shape[2] for shape in shapes}
    assert max(widths) <= 80 and min(widths) >= 40 and len(widths) > 1


def test_per_batch_rescale_gives_a_batch_one_size(record):
    mapper = ClassificationDatasetMapper(
        is_train=True,
        flip_prob=0.5,
        scale_range=(0.5, 1.0),
        max_size_train=80,
        scale_per_batch=True,
    )
    mapped = MapDataset([record], mapper)
    sizes_by_batch = []
    for batch in range(6):
        sizes = set()
        for position in range(batch * 4, batch * 4 + 4):
            sample = mapped.map_at(0, seed=0, position=position, batch=batch * 4)
            sizes.add(tuple(sample["image"].shape))
        sizes_by_batch.append(sizes)
    assert all(len(sizes) == 1 for sizes in sizes_by_batch)  # same record size, same scale
    assert len({sizes.pop() for sizes in sizes_by_batch}) > 1  # the scale still varies


def test_config_keys_are_read_and_checked():
    cfg = get_cfg()
    cfg.INPUT.MAX_SIZE_TRAIN = 96
    cfg.INPUT.MAX_SIZE_TEST = 72
    mapper = ClassificationDatasetMapper(cfg, is_train=True)
    assert (mapper.max_size_train, mapper.max_size_test) == (96, 72)
    assert mapper.scale_per_batch is True  # INPUT.RANDOM_SCALE_PER_BATCH's default
    cfg.INPUT.RANDOM_SCALE_PER_BATCH = False
    assert ClassificationDatasetMapper(cfg, is_train=True).scale_per_batch is False
    cfg.INPUT.MAX_SIZE_TRAIN = -1
    with pytest.raises(ValueError, match="INPUT.MAX_SIZE_TRAIN"):
        ClassificationDatasetMapper(cfg, is_train=True)


def test_unreadable_image_returns_none(tmp_path):
    missing = {"file_name": str(tmp_path / "missing.png"), "label": 0}
    assert ClassificationDatasetMapper(is_train=False)(missing) is None
