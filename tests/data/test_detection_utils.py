"""detection_utils' general part: reading images, sizes, the config's augmentations."""

import logging

import numpy as np
import pytest
import torch
from PIL import Image

from trainkit.config import ConfigError, get_cfg
from trainkit.data import MetadataCatalog
from trainkit.data import detection_utils as utils
from trainkit.data import transforms as T

RED_LEFT = np.zeros((4, 6, 3), np.uint8)
RED_LEFT[:, :3] = (255, 0, 0)  # left half red, right half black


@pytest.fixture
def png(tmp_path):
    path = tmp_path / "image.png"
    Image.fromarray(RED_LEFT).save(path)
    return str(path)


def test_read_image_formats(png):
    np.testing.assert_array_equal(utils.read_image(png, "RGB"), RED_LEFT)
    np.testing.assert_array_equal(utils.read_image(png, "BGR"), RED_LEFT[:, :, ::-1])
    np.testing.assert_array_equal(utils.read_image(png), RED_LEFT)  # the file's own mode
    grey = utils.read_image(png, "L")
    assert grey.shape == (4, 6, 1) and grey[0, 0, 0] == 76 and grey[0, 5, 0] == 0  # 0.299 * 255
    yuv = utils.read_image(png, "YUV-BT.601")
    np.testing.assert_allclose(yuv[0, 0], [0.299, -0.14713, 0.615], atol=1e-6)
    np.testing.assert_allclose(yuv[0, 5], 0)


def test_read_image_applies_the_exif_orientation(tmp_path):
    path = tmp_path / "rotated.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 clockwise to display"
    Image.fromarray(np.full((4, 6, 3), 128, np.uint8)).save(path, exif=exif)
    assert utils.read_image(str(path), "RGB").shape == (6, 4, 3)


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "P"])
def test_bgr_is_read_as_a_contiguous_array_from_any_mode(tmp_path, mode):
    # PIL packs BGR itself: no reversed view that every later resize would have to copy.
    path = tmp_path / f"image_{mode}.png"
    Image.fromarray(RED_LEFT).convert(mode).save(path)
    bgr = utils.read_image(str(path), "BGR")
    assert bgr.flags.c_contiguous and bgr.shape == (4, 6, 3)
    np.testing.assert_array_equal(bgr, RED_LEFT[:, :, ::-1])


def test_bgr_of_an_exif_rotated_image_is_its_rotated_rgb_reversed(tmp_path):
    path = tmp_path / "rotated.png"
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(RED_LEFT).save(path, exif=exif)
    rgb, bgr = utils.read_image(str(path), "RGB"), utils.read_image(str(path), "BGR")
    assert rgb.shape == (6, 4, 3) and rgb[0, 0, 0] == 255 and rgb[5, 0, 0] == 0  # left went up
    np.testing.assert_array_equal(bgr, rgb[:, :, ::-1])


def test_read_image_of_a_broken_file_raises_oserror(tmp_path):
    path = tmp_path / "broken.png"
    path.write_bytes(b"not an image")
    with pytest.raises(OSError):
        utils.read_image(str(path))


@pytest.mark.parametrize("fmt", ["RGB", "BGR", "YUV-BT.601", "L"])
def test_convert_image_to_rgb_undoes_read_image(png, fmt):
    image = utils.read_image(png, fmt)
    rgb = utils.convert_image_to_rgb(torch.as_tensor(np.array(image)), fmt)
    assert rgb.dtype == np.uint8 and rgb.shape == (4, 6, 3)
    expected = np.repeat(utils.read_image(png, "L"), 3, axis=2) if fmt == "L" else RED_LEFT
    np.testing.assert_allclose(rgb, expected, atol=1)


def test_check_image_size_fills_in_and_checks():
    image = np.zeros((4, 6, 3), np.uint8)
    record = {"file_name": "a.png"}
    utils.check_image_size(record, image)
    assert (record["width"], record["height"]) == (6, 4)
    with pytest.raises(utils.SizeMismatchError, match=r"a.png is 6x4 .* says 4x6"):
        utils.check_image_size({"file_name": "a.png", "width": 4, "height": 6}, image)
    assert issubclass(utils.SizeMismatchError, ValueError)


def _cfg(**input_keys):
    cfg = get_cfg()
    for key, value in input_keys.items():
        setattr(cfg.INPUT, key, value)
    return cfg


def test_build_augmentation_reads_the_input_keys():
    train = utils.build_augmentation(
        _cfg(MIN_SIZE_TRAIN=(32, 48), MIN_SIZE_TRAIN_SAMPLING="range", MAX_SIZE_TRAIN=64), True
    )
    assert [type(a) for a in train] == [T.ResizeShortestEdge, T.RandomFlip]
    assert train[0].short_edge_length == (32, 48) and train[0].is_range and train[0].max_size == 64
    assert train[1].horizontal
    vertical = utils.build_augmentation(_cfg(RANDOM_FLIP="vertical"), True)[1]
    assert vertical.vertical and not vertical.horizontal
    assert len(utils.build_augmentation(_cfg(RANDOM_FLIP="none"), True)) == 1
    (test,) = utils.build_augmentation(_cfg(MIN_SIZE_TEST=40, MAX_SIZE_TEST=0), False)
    assert test.short_edge_length == (40, 40) and not test.is_range and test.max_size > 10**9
    assert utils.build_transform_gen is utils.build_augmentation


@pytest.mark.parametrize(
    "keys, match",
    [
        ({"RANDOM_FLIP": "diagonal"}, "INPUT.RANDOM_FLIP"),
        ({"MIN_SIZE_TRAIN_SAMPLING": "uniform"}, "INPUT.MIN_SIZE_TRAIN_SAMPLING"),
        (
            {"MIN_SIZE_TRAIN": (32, 40, 48), "MIN_SIZE_TRAIN_SAMPLING": "range"},
            "INPUT.MIN_SIZE_TRAIN",
        ),
    ],
)
def test_build_augmentation_names_a_bad_key(keys, match):
    with pytest.raises(ConfigError, match=match):
        utils.build_augmentation(_cfg(**keys), True)


def test_check_metadata_consistency(caplog):
    MetadataCatalog.get("du_a").set(classes=["x", "y"])
    MetadataCatalog.get("du_b").set(classes=["x", "y"])
    MetadataCatalog.get("du_c").set(classes=["y", "x"])
    try:
        utils.check_metadata_consistency("classes", ["du_a", "du_b"])
        utils.check_metadata_consistency("classes", [])
        with caplog.at_level(logging.ERROR), pytest.raises(ValueError, match="'du_a' and 'du_c'"):
            utils.check_metadata_consistency("classes", ["du_a", "du_c"])
        assert "['y', 'x']" in caplog.text
        with pytest.raises(AttributeError):
            utils.check_metadata_consistency("no_such_key", ["du_a"])
    finally:
        for name in ("du_a", "du_b", "du_c"):
            MetadataCatalog.remove(name)


def test_detectron2_download_urls_are_refused_in_one_line():
    from trainkit.utils.errors import UsageError

    with pytest.raises(UsageError, match="detectron2 download URL.*pass its local path"):
        utils.read_image("detectron2://assets/Landscape_5.jpg", "RGB")


@pytest.mark.parametrize(
    "name",
    [
        "annotations_to_instances",
        "transform_instance_annotations",
        "gen_crop_transform_with_instance",
    ],
)
def test_detection_functions_import_and_say_they_are_detection_only(name):
    from trainkit.utils.detection_only import DetectionOnlyError

    with pytest.raises(DetectionOnlyError, match=f"{name} is detection-only") as info:
        getattr(utils, name)([], (4, 4))
    assert "\n" not in str(info.value)
