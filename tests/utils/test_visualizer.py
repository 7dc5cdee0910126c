"""Visualizer: segmentation and text change the pixels they should; detection drawings refuse."""

import numpy as np
import pytest
import torch
from PIL import Image

from trainkit.utils.catalog import Metadata
from trainkit.utils.detection_only import DetectionOnlyError
from trainkit.utils.errors import UsageError
from trainkit.utils.visualizer import ColorMode, Visualizer


def _image(h=80, w=120):
    return np.full((h, w, 3), 100, dtype=np.uint8)


def _square_seg(h=80, w=120):
    seg = np.zeros((h, w), dtype=np.int64)
    seg[10:70, 20:100] = 1
    return seg


def test_draw_sem_seg_colours_the_mask_with_the_class_colour():
    colors = [[0, 0, 0], [255, 0, 0]]
    meta = Metadata("toy").set(stuff_classes=["bg", "square"], stuff_colors=colors)
    seg = _square_seg()
    out = Visualizer(_image(), meta).draw_sem_seg(torch.as_tensor(seg), alpha=0.5).get_image()
    assert out.shape == (80, 120, 3) and out.dtype == np.uint8
    # Inside the square (away from its outline and label): half red over grey 100.
    assert np.abs(out[12, 22].astype(int) - (177.5, 50, 50)).max() <= 1
    # The background class is black at half opacity.
    assert tuple(out[4, 4]) == (50, 50, 50)
    # The outline is off-white.
    assert tuple(out[10, 60]) == (255, 255, 240)


def test_labels_without_a_class_and_the_ignore_label_are_not_drawn():
    meta = Metadata("toy").set(stuff_classes=["bg"])
    seg = _square_seg()
    seg[0:5, 0:5] = 255
    out = Visualizer(_image(), meta).draw_sem_seg(seg).get_image()
    assert (out[20:60, 30:90] == 100).all()  # class 1 has no name: untouched
    assert (out[0:4, 0:4] == 100).all()  # ignored pixels untouched
    assert (out[75:, 5:15] != 100).any(axis=2).all()  # class 0 drawn


def test_draw_text_writes_near_the_position_only():
    vis = Visualizer(_image(100, 200))
    out = vis.draw_text("hello", (100, 50), font_size=14, color="w").get_image()
    changed = np.argwhere((out != 100).any(axis=2))
    assert len(changed) > 0
    rows, cols = changed[:, 0], changed[:, 1]
    assert 30 < rows.min() and rows.max() < 70 and 50 < cols.min() and cols.max() < 150
    assert (out[rows, cols] == 255).all(axis=1).any()  # white glyph pixels


def test_draw_dataset_dict_reads_the_sem_seg_file(tmp_path):
    gt = tmp_path / "gt.png"
    Image.fromarray(_square_seg().astype(np.uint8)).save(gt)
    meta = Metadata("toy").set(stuff_classes=["bg", "square"])
    out = Visualizer(_image(), meta).draw_dataset_dict({"sem_seg_file_name": str(gt)})
    image = out.get_image()
    assert (image[12, 22] != 100).any() and (image[12, 22] != image[4, 4]).any()
    out.save(str(tmp_path / "sub" / "vis.png"))
    assert np.array_equal(np.asarray(Image.open(tmp_path / "sub" / "vis.png")), image)


def test_scale_and_grey_input():
    out = Visualizer(np.zeros((10, 20)), scale=2.0).get_output().get_image()
    assert out.shape == (20, 40, 3)


@pytest.mark.parametrize(
    "call",
    [
        lambda v: v.draw_instance_predictions(None),
        lambda v: v.draw_panoptic_seg(None, None),
        lambda v: v.overlay_instances(boxes=[[0, 0, 1, 1]]),
        lambda v: v.draw_box((0, 0, 1, 1)),
        lambda v: v.draw_dataset_dict({"annotations": [{"bbox": [0, 0, 1, 1]}]}),
    ],
)
def test_detection_drawings_are_detection_only(call):
    vis = Visualizer(_image(), instance_mode=ColorMode.SEGMENTATION)
    with pytest.raises(DetectionOnlyError, match="is detection-only"):
        call(vis)


def test_a_chw_image_is_a_usage_error():
    with pytest.raises(UsageError, match=r"permute\(1, 2, 0\)"):
        Visualizer(np.zeros((3, 8, 8)))
