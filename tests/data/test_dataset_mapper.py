"""DatasetMapper, the loaders' default mapper, and load_sem_seg."""

import itertools

import numpy as np
import pytest
import torch
from PIL import Image

from trainkit.config import get_cfg
from trainkit.data import (
    DatasetCatalog,
    DatasetMapper,
    build_detection_test_loader,
    build_detection_train_loader,
)
from trainkit.data import transforms as T
from trainkit.data.datasets import load_sem_seg
from trainkit.data.detection_utils import SizeMismatchError
from trainkit.utils.errors import UsageError


def write_pair(root, name, width, height, label):
    """An image whose left half is red, and a label map: ``label`` on the left, 0 elsewhere."""
    (root / "images").mkdir(exist_ok=True)
    (root / "labels").mkdir(exist_ok=True)
    image = np.zeros((height, width, 3), np.uint8)
    image[:, : width // 2] = (200, 0, 0)
    labels = np.zeros((height, width), np.uint8)
    labels[:, : width // 2] = label
    Image.fromarray(image).save(root / "images" / f"{name}.png")
    Image.fromarray(labels).save(root / "labels" / f"{name}.png")


@pytest.fixture
def seg_dir(tmp_path):
    for i in range(6):
        write_pair(tmp_path, f"im{i}", 8 + 2 * i, 6, label=i + 1)
    return tmp_path


def test_load_sem_seg_pairs_files_by_name(seg_dir, caplog):
    (seg_dir / "images" / "extra.png").write_bytes(b"")  # no label map: left out
    records = load_sem_seg(str(seg_dir / "labels"), str(seg_dir / "images"), image_ext="png")
    assert [r["file_name"].rsplit("/", 1)[1] for r in records] == [f"im{i}.png" for i in range(6)]
    assert all(
        r["sem_seg_file_name"] == r["file_name"].replace("images", "labels") for r in records
    )
    assert all(set(r) == {"file_name", "sem_seg_file_name"} for r in records)  # no sizes
    assert "using the 6 names found in both" in caplog.text
    with pytest.raises(UsageError, match="found no image"):
        load_sem_seg(str(seg_dir / "labels"), str(seg_dir / "images"))  # *.jpg: none
    with pytest.raises(UsageError, match="not a directory"):
        load_sem_seg(str(seg_dir / "nowhere"), str(seg_dir / "images"))


def test_mapper_reads_augments_and_keeps_the_rest(seg_dir):
    record = load_sem_seg(str(seg_dir / "labels"), str(seg_dir / "images"), image_ext="png")[1]
    record.update(label=3, annotations=[{"anything": [1, 2]}])
    mapper = DatasetMapper(
        is_train=True, augmentations=[T.Resize((3, 5)), T.HFlipTransform(5)], image_format="BGR"
    )
    out = mapper(record)
    assert out["image"].dtype == torch.uint8 and out["image"].shape == (3, 3, 5)
    # BGR: red is channel 2; flipped: the red half is on the right now.
    assert out["image"][2, 0, -1] == 200 and out["image"][2, 0, 0] == 0
    assert out["sem_seg"].dtype == torch.long and out["sem_seg"].shape == (3, 5)
    assert out["sem_seg"][0, -1] == 2 and out["sem_seg"][0, 0] == 0
    assert (out["width"], out["height"]) == (10, 6)  # the image as read
    assert out["label"] == 3 and out["annotations"] is record["annotations"]  # untouched
    assert "sem_seg_file_name" not in out and "image" not in record  # the input is not changed
    tested = DatasetMapper(is_train=False, augmentations=[], image_format="RGB")(record)
    assert "annotations" not in tested and tested["image"].shape == (3, 6, 10)


def test_mapper_from_config(seg_dir):
    cfg = get_cfg()
    cfg.INPUT.MIN_SIZE_TRAIN, cfg.INPUT.MAX_SIZE_TRAIN = (12,), 100
    cfg.INPUT.MIN_SIZE_TEST, cfg.INPUT.FORMAT = 0, "RGB"
    cfg.INPUT.CROP.ENABLED, cfg.INPUT.CROP.TYPE, cfg.INPUT.CROP.SIZE = True, "absolute", [3, 4]
    train = DatasetMapper(cfg, True)
    assert [type(a) for a in train.augmentations.augs] == [
        T.RandomCrop,
        T.ResizeShortestEdge,
        T.RandomFlip,
    ]
    record = {"file_name": str(seg_dir / "images" / "im0.png")}
    assert DatasetMapper(cfg, is_train=True)(record)["image"].shape == (3, 12, 16)  # crop 3x4, x4
    test = DatasetMapper(cfg, False)
    assert [type(a) for a in test.augmentations.augs] == [T.ResizeShortestEdge]
    assert test(record)["image"].shape == (3, 6, 8)  # MIN_SIZE_TEST 0: as it is
    cfg.MODEL.MASK_ON = True
    with pytest.raises(UsageError, match=r"use_instance_mask=True.*detection-only"):
        DatasetMapper(cfg, True)


def test_a_subclass_setting_tfm_gens_replaces_the_augmentations(seg_dir):
    # detectron2 0.1's mapper applied self.tfm_gens; projects of that time set it after
    # super().__init__ (tkianai/ImageClassification.detectron2 resizes to its input size).
    class ClassificationMapper(DatasetMapper):
        def __init__(self, cfg, is_train=True):
            super().__init__(cfg, is_train)
            self.tfm_gens = [T.Resize((4, 4)), T.HFlipTransform(4)]

    cfg = get_cfg()
    mapper = ClassificationMapper(cfg, True)
    assert [type(a).__name__ for a in mapper.augmentations.augs][0] == "Resize"
    assert len(mapper.tfm_gens) == 2
    out = mapper({"file_name": str(seg_dir / "images" / "im1.png")})
    assert out["image"].shape == (3, 4, 4)
    # BGR by default: red is channel 2, on the right half once flipped.
    assert out["image"][2, 0, -1] == 200 and out["image"][2, 0, 0] == 0


@pytest.mark.parametrize(
    "argument", ["use_keypoint", "recompute_boxes", "precomputed_proposal_topk"]
)
def test_detection_arguments_are_accepted_but_refused_when_on(argument):
    DatasetMapper(is_train=True, augmentations=[], image_format="RGB", **{argument: False})
    with pytest.raises(UsageError, match="detection-only"):
        DatasetMapper(is_train=True, augmentations=[], image_format="RGB", **{argument: 5})


def test_mapper_errors(seg_dir):
    mapper = DatasetMapper(is_train=True, augmentations=[], image_format="RGB")
    with pytest.raises(UsageError, match="no 'file_name'.*pass mapper="):
        mapper({"id": 3, "x": [1.0]})
    with pytest.raises(UsageError, match="of type int"):
        mapper(3)
    with pytest.raises(SizeMismatchError):
        mapper({"file_name": str(seg_dir / "images" / "im0.png"), "width": 9, "height": 6})
    with pytest.raises(OSError):
        mapper({"file_name": str(seg_dir / "missing.png")})


@pytest.fixture
def registered(seg_dir):
    DatasetCatalog.register(
        "dm_seg",
        lambda: load_sem_seg(str(seg_dir / "labels"), str(seg_dir / "images"), image_ext="png"),
    )
    DatasetCatalog.register("dm_plain", lambda: [{"id": i} for i in range(4)])
    yield
    DatasetCatalog.remove("dm_seg")
    DatasetCatalog.remove("dm_plain")


def _cfg(num_workers=0):
    cfg = get_cfg()
    cfg.SEED = 3
    cfg.DATASETS.TRAIN = ("dm_seg",)
    cfg.SOLVER.IMS_PER_BATCH = 2
    cfg.TEST.IMS_PER_BATCH = 2
    cfg.DATALOADER.NUM_WORKERS = num_workers
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = False  # load_sem_seg's records have no sizes
    cfg.INPUT.FORMAT = "RGB"
    cfg.INPUT.MIN_SIZE_TRAIN, cfg.INPUT.MIN_SIZE_TRAIN_SAMPLING = (4, 8), "range"
    cfg.INPUT.MIN_SIZE_TEST = 0
    return cfg


def _fingerprint(batches):
    return [
        [(r["file_name"], tuple(r["image"].shape), r["image"].sum().item()) for r in b]
        for b in batches
    ]


def test_config_form_loaders_default_to_the_dataset_mapper(registered):
    batches = list(itertools.islice(iter(build_detection_train_loader(_cfg())), 6))
    assert all(set(r) >= {"image", "sem_seg", "height", "width"} for b in batches for r in b)
    assert {r["image"].shape[1] for b in batches for r in b} <= {4, 5, 6, 7, 8}
    # The same augmented batches with loader workers (keyed by position).
    with_workers = itertools.islice(iter(build_detection_train_loader(_cfg(num_workers=2))), 6)
    assert _fingerprint(with_workers) == _fingerprint(batches)
    test_batches = list(build_detection_test_loader(_cfg(), "dm_seg"))
    assert [tuple(r["image"].shape) for b in test_batches for r in b][:2] == [(3, 6, 8), (3, 6, 10)]
    # The explicit form keeps detectron2's meaning of mapper=None: records as they are.
    plain = build_detection_train_loader(
        [{"id": 1}] * 4, mapper=None, total_batch_size=2, aspect_ratio_grouping=False, seed=0
    )
    assert next(iter(plain)) == [{"id": 1}, {"id": 1}]


def test_records_without_file_name_under_the_default_mapper_say_to_pass_one(registered):
    cfg = _cfg()
    cfg.DATASETS.TRAIN = ("dm_plain",)
    with pytest.raises(UsageError, match="no 'file_name'.*pass mapper="):
        next(iter(build_detection_train_loader(cfg)))
    with pytest.raises(UsageError, match="no 'file_name'"):
        next(iter(build_detection_test_loader(cfg, "dm_plain")))
