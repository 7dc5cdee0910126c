"""The built-in shapes dataset (tiny splits under tmp_path) and ClassificationDatasetMapper."""

from __future__ import annotations

import json
import logging
import os
import threading

import numpy as np
import pytest
import torch
from PIL import Image

from trainkit.config import get_cfg
from trainkit.data import DatasetCatalog, MapDataset, MetadataCatalog
from trainkit.data.datasets import SHAPES_CLASSES, get_datasets_root, load_shapes, register_shapes
from trainkit.data.datasets import shapes as shapes_module
from trainkit.data.mapping.mappers import ClassificationDatasetMapper

NUM_IMAGES = 24


def _load(root, num_images=NUM_IMAGES, seed=0, split="train"):
    return load_shapes(split, num_images, seed, str(root), num_workers=1, show_progress=False)


def test_records_fields_sizes_and_classes(tmp_path):
    records = _load(tmp_path)
    assert len(records) == NUM_IMAGES
    assert [r["image_id"] for r in records] == list(range(NUM_IMAGES))
    for r in records:
        assert set(r) == {"file_name", "height", "width", "label", "image_id"}
        assert 48 <= r["width"] <= 192 and 48 <= r["height"] <= 192
        with Image.open(r["file_name"]) as image:
            assert image.size == (r["width"], r["height"])
            assert image.mode == "RGB"
    assert len(SHAPES_CLASSES) >= 6
    assert {r["label"] for r in records} == set(range(len(SHAPES_CLASSES)))
    ratios = [r["width"] / r["height"] for r in records]
    assert min(ratios) < 0.9 and max(ratios) > 1.1  # both orientations
    assert len({r["width"] for r in records}) > NUM_IMAGES // 2  # sizes vary


def test_generation_is_deterministic(tmp_path):
    first = _load(tmp_path / "a")
    second = _load(tmp_path / "b")
    for a, b in zip(first, second):
        with open(a["file_name"], "rb") as fa, open(b["file_name"], "rb") as fb:
            assert fa.read() == fb.read()
    other_seed = _load(tmp_path / "c", seed=1)
    assert [r["width"] for r in other_seed] != [r["width"] for r in first]


def test_interrupted_generation_leaves_no_complete_split(tmp_path, monkeypatch):
    real_render = shapes_module.render_shape_image

    def render_then_die(seed, index, label):
        if index == NUM_IMAGES // 2:
            raise KeyboardInterrupt  # e.g. Ctrl-C halfway
        return real_render(seed, index, label)

    monkeypatch.setattr(shapes_module, "render_shape_image", render_then_die)
    with pytest.raises(KeyboardInterrupt):
        _load(tmp_path)
    shapes_dir = tmp_path / "shapes"
    assert not (shapes_dir / "train").exists()
    assert [p.name for p in shapes_dir.iterdir() if p.is_dir()] == []  # temp dir removed

    # A process killed outright leaves a split directory without manifest (or stray temp
    # directories); neither counts as complete.
    (shapes_dir / "train").mkdir()
    (shapes_dir / "train" / "000000.png").write_bytes(b"half")
    monkeypatch.setattr(shapes_module, "render_shape_image", real_render)
    records = _load(tmp_path)
    assert len(records) == NUM_IMAGES
    assert json.loads((shapes_dir / "train" / "manifest.json").read_text())["num_images"] == 24
    with Image.open(records[0]["file_name"]) as image:
        image.load()


def test_regenerates_when_manifest_does_not_match(tmp_path, caplog):
    _load(tmp_path, num_images=6)
    with caplog.at_level(logging.WARNING):
        records = _load(tmp_path, num_images=12)
    assert len(records) == 12 and "regenerating" in caplog.text
    assert len([f for f in os.listdir(tmp_path / "shapes" / "train") if f.endswith(".png")]) == 12


def test_concurrent_callers_generate_once(tmp_path, caplog):
    results = [None] * 3

    def worker(i):
        results[i] = _load(tmp_path, num_images=12)

    # flock locks separate open file descriptions, so threads contend like processes.
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    with caplog.at_level(logging.INFO, logger="trainkit.data.datasets"):
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    generated = [r for r in caplog.records if r.getMessage().startswith("Generated 12 shapes")]
    assert len(generated) == 1
    assert results[0] == results[1] == results[2]


def test_env_var_and_lazy_registration(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINKIT_DATASETS", str(tmp_path))
    assert get_datasets_root() == str(tmp_path)
    register_shapes(name_prefix="test_tiny", splits={"train": (6, 0)})
    try:
        assert not (tmp_path / "shapes").exists()  # registering generates nothing
        records = DatasetCatalog.get("test_tiny_train")
        assert len(records) == 6
        assert records[0]["file_name"].startswith(str(tmp_path / "shapes" / "train"))
        assert MetadataCatalog.get("test_tiny_train").thing_classes == list(SHAPES_CLASSES)
    finally:
        DatasetCatalog.remove("test_tiny_train")
        MetadataCatalog.remove("test_tiny_train")


def test_builtin_names_registered_on_import():
    assert "shapes_train" in DatasetCatalog.list() and "shapes_val" in DatasetCatalog.list()
    assert MetadataCatalog.get("shapes_val").thing_classes == list(SHAPES_CLASSES)


# ---------------------------------------------------------------------------------------
# ClassificationDatasetMapper
# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_records(tmp_path_factory):
    return _load(tmp_path_factory.mktemp("mapper"), num_images=4)


def _map(mapper, record, *, seed, position):
    return MapDataset([record], mapper).map_at(0, seed=seed, position=position)


def test_mapper_output_format_in_test_mode(tiny_records):
    mapper = ClassificationDatasetMapper(get_cfg(), is_train=False)
    record = tiny_records[0]
    out = mapper(record)
    assert out["image"].dtype == torch.uint8
    assert tuple(out["image"].shape) == (3, record["height"], record["width"])
    assert out["label"] == record["label"] and out["image_id"] == record["image_id"]
    with Image.open(record["file_name"]) as image:
        assert np.array_equal(out["image"].permute(1, 2, 0).numpy(), np.asarray(image))

    capped = ClassificationDatasetMapper(is_train=False, max_size_test=40)(record)
    assert max(capped["image"].shape[1:]) == 40
    assert (capped["height"], capped["width"]) == (record["height"], record["width"])


def test_mapper_augmentation_is_deterministic_per_sample(tiny_records):
    mapper = ClassificationDatasetMapper(flip_prob=0.5, scale_range=(0.5, 1.5))
    record = tiny_records[1]
    outs = [_map(mapper, record, seed=7, position=p)["image"] for p in range(8)]
    again = [_map(mapper, record, seed=7, position=p)["image"] for p in range(8)]
    assert all(torch.equal(a, b) for a, b in zip(outs, again))
    assert len({tuple(o.shape) for o in outs}) > 1  # the scale depends on the position
    other_seed = [_map(mapper, record, seed=8, position=p)["image"] for p in range(8)]
    assert not all(torch.equal(a, b) for a, b in zip(outs, other_seed))


def test_mapper_flip(tiny_records):
    record = tiny_records[2]
    plain = ClassificationDatasetMapper(is_train=False)(record)["image"]
    flipped = _map(ClassificationDatasetMapper(flip_prob=1.0), record, seed=0, position=0)
    assert torch.equal(flipped["image"], plain.flip(-1))
    kept = _map(ClassificationDatasetMapper(flip_prob=0.0), record, seed=0, position=0)
    assert torch.equal(kept["image"], plain)


def test_mapper_missing_file_returns_none(tmp_path, caplog):
    missing = str(tmp_path / "nope.png")
    record = {"file_name": missing, "height": 10, "width": 10, "label": 0, "image_id": 0}
    with caplog.at_level(logging.WARNING):
        assert ClassificationDatasetMapper(is_train=False)(record) is None
    assert missing in caplog.text


def test_mapper_rejects_bad_scale_range():
    with pytest.raises(ValueError, match="INPUT.RANDOM_SCALE"):
        ClassificationDatasetMapper(scale_range=(1.2, 0.8))
