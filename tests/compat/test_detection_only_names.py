"""detectron2's detection-only names import from each of its paths; using one says why not.

Scripts copied from detectron2's tools/train_net.py import them even when they never use them.
"""

import importlib

import pytest

from trainkit.utils.errors import UsageError

NAMES = {
    "trainkit.structures": [
        "BoxMode",
        "Boxes",
        "Instances",
        "BitMasks",
        "PolygonMasks",
        "RotatedBoxes",
        "Keypoints",
        "pairwise_iou",
        "pairwise_ioa",
        "pairwise_iou_rotated",
        "polygons_to_bitmask",
        "heatmaps_to_keypoints",
    ],
    "trainkit.structures.boxes": ["BoxMode", "Boxes", "pairwise_iou", "pairwise_ioa"],
    "trainkit.structures.instances": ["Instances"],
    "trainkit.structures.masks": ["BitMasks", "PolygonMasks", "polygons_to_bitmask"],
    "trainkit.structures.keypoints": ["Keypoints", "heatmaps_to_keypoints"],
    "trainkit.structures.rotated_boxes": ["RotatedBoxes", "pairwise_iou"],
    "trainkit.evaluation": [
        # detectron2 0.1 exported the Cityscapes base class from the package; projects of
        # that time (tkianai/ImageClassification.detectron2) import it from there.
        "CityscapesEvaluator",
        "COCOEvaluator",
        "LVISEvaluator",
        "PascalVOCDetectionEvaluator",
        "CityscapesInstanceEvaluator",
        "CityscapesSemSegEvaluator",
        "COCOPanopticEvaluator",
        "RotatedCOCOEvaluator",
    ],
    "trainkit.evaluation.coco_evaluation": ["COCOEvaluator"],
    "trainkit.evaluation.lvis_evaluation": ["LVISEvaluator"],
    "trainkit.evaluation.pascal_voc_evaluation": ["PascalVOCDetectionEvaluator"],
    "trainkit.evaluation.cityscapes_evaluation": [
        "CityscapesEvaluator",
        "CityscapesInstanceEvaluator",
        "CityscapesSemSegEvaluator",
    ],
    "trainkit.evaluation.panoptic_evaluation": ["COCOPanopticEvaluator"],
    "trainkit.evaluation.rotated_coco_evaluation": ["RotatedCOCOEvaluator"],
    "trainkit.modeling": [
        "GeneralizedRCNNWithTTA",
        "detector_postprocess",
        "GeneralizedRCNN",
        "RetinaNet",
    ],
    "trainkit.modeling.postprocessing": ["detector_postprocess"],
    "trainkit.checkpoint.c2_model_loading": [
        "convert_basic_c2_names",
        "convert_c2_detectron_names",
    ],
    # Not detection-only, but not shipped: the message says to register a backbone instead.
    "trainkit.modeling.backbone.resnet": [
        "ResNet",
        "BasicStem",
        "BasicBlock",
        "BottleneckBlock",
        "DeformBottleneckBlock",
        "build_resnet_backbone",
        "make_stage",
    ],
    "trainkit.layers": ["batched_nms", "nms", "nms_rotated", "batched_nms_rotated"],
    "trainkit.layers.nms": ["batched_nms", "nms", "nms_rotated", "batched_nms_rotated"],
    "trainkit.modeling.anchor_generator": [
        "ANCHOR_GENERATOR_REGISTRY",
        "DefaultAnchorGenerator",
        "RotatedAnchorGenerator",
        "build_anchor_generator",
    ],
    "trainkit.modeling.box_regression": [
        "Box2BoxTransform",
        "Box2BoxTransformRotated",
        "Box2BoxTransformLinear",
    ],
    "trainkit.modeling.matcher": ["Matcher"],
    "trainkit.modeling.meta_arch.retinanet": ["RetinaNet", "RetinaNetHead", "permute_to_N_HWA_K"],
    "trainkit.modeling.backbone.fpn": [
        "FPN",
        "LastLevelMaxPool",
        "LastLevelP6P7",
        "build_resnet_fpn_backbone",
        "build_retinanet_resnet_fpn_backbone",
    ],
    "trainkit.modeling.meta_arch": ["GeneralizedRCNN", "ProposalNetwork", "RetinaNet"],
    "trainkit.modeling.meta_arch.rcnn": ["GeneralizedRCNN", "ProposalNetwork"],
    "trainkit.modeling.test_time_augmentation": ["GeneralizedRCNNWithTTA"],
    "trainkit.data.datasets": ["register_coco_instances", "load_coco_json"],
    "trainkit.data.datasets.coco": ["register_coco_instances", "load_coco_json"],
}
CASES = [(module, name) for module, names in NAMES.items() for name in names]


@pytest.mark.parametrize(("module", "name"), CASES)
def test_name_imports_and_using_it_is_a_one_line_usage_error(module, name):
    placeholder = getattr(importlib.import_module(module), name)
    with pytest.raises(UsageError) as info:
        placeholder("coco_2017_val", output_dir="out")
    message = str(info.value)
    assert "\n" not in message
    # (a module named like its package's function: layers.nms, once imported)
    assert message.startswith(f"{placeholder.__name__.rsplit('.', 1)[-1]} is ")
    assert "keep using detectron2's" in message


def test_train_net_style_imports_and_subclassing_work():
    # The imports of detectron2's tools/train_net.py, with trainkit for detectron2.
    from trainkit.checkpoint import DetectionCheckpointer  # noqa: F401
    from trainkit.config import get_cfg  # noqa: F401
    from trainkit.data import MetadataCatalog  # noqa: F401
    from trainkit.engine import DefaultTrainer, default_argument_parser, hooks  # noqa: F401
    from trainkit.evaluation import (  # noqa: F401
        CityscapesInstanceEvaluator,
        CityscapesSemSegEvaluator,
        COCOEvaluator,
        COCOPanopticEvaluator,
        DatasetEvaluators,
        LVISEvaluator,
        PascalVOCDetectionEvaluator,
        SemSegEvaluator,
        verify_results,
    )
    from trainkit.modeling import GeneralizedRCNNWithTTA  # noqa: F401
    from trainkit.structures import BoxMode

    class MyCOCOEvaluator(COCOEvaluator):  # a project's subclass, defined at import
        pass

    with pytest.raises(UsageError, match="COCO box, mask and keypoint AP"):
        MyCOCOEvaluator("coco_2017_val")
    with pytest.raises(UsageError, match="BoxMode is detection-only"):
        BoxMode.XYWH_ABS  # noqa: B018


def test_cityscapes_sem_seg_points_to_sem_seg_evaluator():
    from trainkit.evaluation import CityscapesSemSegEvaluator

    with pytest.raises(UsageError, match="use trainkit.evaluation.SemSegEvaluator"):
        CityscapesSemSegEvaluator("cityscapes_fine_sem_seg_val")
