"""Every module path of detectron2 imports under trainkit, and placeholders stay out of the way.

detectron2 scripts move over by changing ``detectron2`` to ``trainkit`` in their imports,
including imports of modules they never use (a classification project that copied a
detector's header imports ``modeling.roi_heads`` and ``evaluation.fast_eval_api``). So every
module of detectron2 has a trainkit counterpart: a real module for what is general, a module
of placeholders (``_PLACEHOLDER_MODULE = True``) for what is detection-only. A placeholder
module loads only when a script imports it by its own path: the package ``__init__``s make
the detection names they export themselves.
"""

import importlib
import subprocess
import sys

import pytest

from trainkit.utils.errors import UsageError

# detectron2's modules (its main branch, read in 2025): every .py file under detectron2/
# except layers/csrc (C++ and CUDA only) and model_zoo/configs (config files). That is 134
# modules plus the 22 packages (__init__.py) holding them; the packages count too, since
# scripts import them (``from detectron2.modeling.roi_heads import StandardROIHeads``).
REAL = [
    "detectron2",
    "detectron2.checkpoint",
    "detectron2.checkpoint.c2_model_loading",
    "detectron2.checkpoint.detection_checkpoint",
    "detectron2.config",
    "detectron2.config.compat",
    "detectron2.config.config",
    "detectron2.config.defaults",
    "detectron2.config.instantiate",
    "detectron2.config.lazy",
    "detectron2.data",
    "detectron2.data.benchmark",
    "detectron2.data.build",
    "detectron2.data.catalog",
    "detectron2.data.common",
    "detectron2.data.dataset_mapper",
    "detectron2.data.detection_utils",
    "detectron2.data.datasets",
    "detectron2.data.samplers",
    "detectron2.data.samplers.distributed_sampler",
    "detectron2.data.samplers.grouped_batch_sampler",
    "detectron2.data.transforms",
    "detectron2.data.transforms.augmentation",
    "detectron2.data.transforms.augmentation_impl",
    "detectron2.data.transforms.transform",
    "detectron2.engine",
    "detectron2.engine.defaults",
    "detectron2.engine.hooks",
    "detectron2.engine.launch",
    "detectron2.engine.train_loop",
    "detectron2.evaluation",
    "detectron2.evaluation.evaluator",
    "detectron2.evaluation.sem_seg_evaluation",
    "detectron2.evaluation.testing",
    "detectron2.layers",
    "detectron2.layers.aspp",
    "detectron2.layers.batch_norm",
    "detectron2.layers.blocks",
    "detectron2.layers.shape_spec",
    "detectron2.layers.wrappers",
    "detectron2.model_zoo",
    "detectron2.model_zoo.model_zoo",
    "detectron2.modeling",
    "detectron2.modeling.postprocessing",
    "detectron2.modeling.backbone",
    "detectron2.modeling.backbone.backbone",
    "detectron2.modeling.backbone.build",
    "detectron2.modeling.meta_arch",
    "detectron2.modeling.meta_arch.build",
    "detectron2.modeling.meta_arch.semantic_seg",
    "detectron2.solver",
    "detectron2.solver.build",
    "detectron2.solver.lr_scheduler",
    "detectron2.structures",
    "detectron2.structures.image_list",
    "detectron2.utils",
    "detectron2.utils.analysis",
    "detectron2.utils.collect_env",
    "detectron2.utils.colormap",
    "detectron2.utils.comm",
    "detectron2.utils.develop",
    "detectron2.utils.env",
    "detectron2.utils.events",
    "detectron2.utils.file_io",
    "detectron2.utils.logger",
    "detectron2.utils.memory",
    "detectron2.utils.registry",
    "detectron2.utils.serialize",
    "detectron2.utils.testing",
    "detectron2.utils.torch_version_utils",
    "detectron2.utils.tracing",
    "detectron2.utils.visualizer",
]
PLACEHOLDER = [
    "detectron2.checkpoint.catalog",
    "detectron2.data.datasets.builtin",
    "detectron2.data.datasets.builtin_meta",
    "detectron2.data.datasets.cityscapes",
    "detectron2.data.datasets.cityscapes_panoptic",
    "detectron2.data.datasets.coco",
    "detectron2.data.datasets.coco_panoptic",
    "detectron2.data.datasets.lvis",
    "detectron2.data.datasets.lvis_v0_5_categories",
    "detectron2.data.datasets.lvis_v1_categories",
    "detectron2.data.datasets.lvis_v1_category_image_count",
    "detectron2.data.datasets.pascal_voc",
    "detectron2.data.datasets.register_coco",
    "detectron2.evaluation.cityscapes_evaluation",
    "detectron2.evaluation.coco_evaluation",
    "detectron2.evaluation.fast_eval_api",
    "detectron2.evaluation.lvis_evaluation",
    "detectron2.evaluation.panoptic_evaluation",
    "detectron2.evaluation.pascal_voc_evaluation",
    "detectron2.evaluation.rotated_coco_evaluation",
    "detectron2.export",
    "detectron2.export.api",
    "detectron2.export.c10",
    "detectron2.export.caffe2_export",
    "detectron2.export.caffe2_inference",
    "detectron2.export.caffe2_modeling",
    "detectron2.export.caffe2_patch",
    "detectron2.export.flatten",
    "detectron2.export.shared",
    "detectron2.export.torchscript",
    "detectron2.export.torchscript_patch",
    "detectron2.layers.deform_conv",
    "detectron2.layers.losses",
    "detectron2.layers.mask_ops",
    "detectron2.layers.nms",
    "detectron2.layers.roi_align",
    "detectron2.layers.roi_align_rotated",
    "detectron2.layers.rotated_boxes",
    "detectron2.modeling.anchor_generator",
    "detectron2.modeling.box_regression",
    "detectron2.modeling.matcher",
    "detectron2.modeling.mmdet_wrapper",
    "detectron2.modeling.poolers",
    "detectron2.modeling.sampling",
    "detectron2.modeling.test_time_augmentation",
    "detectron2.modeling.backbone.fpn",
    "detectron2.modeling.backbone.mvit",
    "detectron2.modeling.backbone.regnet",
    "detectron2.modeling.backbone.resnet",
    "detectron2.modeling.backbone.swin",
    "detectron2.modeling.backbone.utils",
    "detectron2.modeling.backbone.vit",
    "detectron2.modeling.meta_arch.dense_detector",
    "detectron2.modeling.meta_arch.fcos",
    "detectron2.modeling.meta_arch.panoptic_fpn",
    "detectron2.modeling.meta_arch.rcnn",
    "detectron2.modeling.meta_arch.retinanet",
    "detectron2.modeling.proposal_generator",
    "detectron2.modeling.proposal_generator.build",
    "detectron2.modeling.proposal_generator.proposal_utils",
    "detectron2.modeling.proposal_generator.rpn",
    "detectron2.modeling.proposal_generator.rrpn",
    "detectron2.modeling.roi_heads",
    "detectron2.modeling.roi_heads.box_head",
    "detectron2.modeling.roi_heads.cascade_rcnn",
    "detectron2.modeling.roi_heads.fast_rcnn",
    "detectron2.modeling.roi_heads.keypoint_head",
    "detectron2.modeling.roi_heads.mask_head",
    "detectron2.modeling.roi_heads.roi_heads",
    "detectron2.modeling.roi_heads.rotated_fast_rcnn",
    "detectron2.projects",
    "detectron2.structures.boxes",
    "detectron2.structures.instances",
    "detectron2.structures.keypoints",
    "detectron2.structures.masks",
    "detectron2.structures.rotated_boxes",
    "detectron2.tracking",
    "detectron2.tracking.base_tracker",
    "detectron2.tracking.bbox_iou_tracker",
    "detectron2.tracking.hungarian_tracker",
    "detectron2.tracking.iou_weighted_hungarian_bbox_iou_tracker",
    "detectron2.tracking.utils",
    "detectron2.tracking.vanilla_hungarian_bbox_iou_tracker",
    "detectron2.utils.video_visualizer",
]
PACKAGES = [
    "detectron2",
    "detectron2.checkpoint",
    "detectron2.config",
    "detectron2.data",
    "detectron2.data.datasets",
    "detectron2.data.samplers",
    "detectron2.data.transforms",
    "detectron2.engine",
    "detectron2.evaluation",
    "detectron2.export",
    "detectron2.layers",
    "detectron2.model_zoo",
    "detectron2.modeling",
    "detectron2.modeling.backbone",
    "detectron2.modeling.meta_arch",
    "detectron2.modeling.proposal_generator",
    "detectron2.modeling.roi_heads",
    "detectron2.projects",
    "detectron2.solver",
    "detectron2.structures",
    "detectron2.tracking",
    "detectron2.utils",
]


def _trainkit(path):
    return "trainkit" + path[len("detectron2") :]


def test_the_list_is_detectron2s_134_modules_and_22_packages():
    assert len(set(REAL + PLACEHOLDER)) == len(REAL) + len(PLACEHOLDER) == 156
    assert set(PACKAGES) <= set(REAL + PLACEHOLDER) and len(set(PACKAGES)) == 22


@pytest.mark.parametrize("path", REAL + PLACEHOLDER)
def test_every_detectron2_module_path_imports(path):
    module = importlib.import_module(_trainkit(path))
    is_placeholder = vars(module).get("_PLACEHOLDER_MODULE", False)
    assert is_placeholder is (path in PLACEHOLDER), f"{path}: real or placeholder?"
    if path in PACKAGES:
        assert hasattr(module, "__path__"), f"{path} is a package in detectron2"


# Detection names of detectron2's modules and packages that trainkit did not have before,
# by detectron2's path: each imports from there, and using it is a one-line UsageError.
DETECTION_NAMES = {
    "detectron2.checkpoint.catalog": ["ModelCatalog", "ModelCatalogHandler"],
    "detectron2.data.datasets": [
        "convert_to_coco_json",
        "register_coco_panoptic",
        "register_coco_panoptic_separated",
        "load_lvis_json",
        "register_lvis_instances",
        "get_lvis_instances_meta",
        "load_voc_instances",
        "register_pascal_voc",
    ],
    "detectron2.data.datasets.builtin": [
        "register_all_coco",
        "register_all_lvis",
        "register_all_cityscapes",
        "register_all_cityscapes_panoptic",
        "register_all_pascal_voc",
        "register_all_ade20k",
    ],
    "detectron2.data.datasets.builtin_meta": [
        "COCO_CATEGORIES",
        "COCO_PERSON_KEYPOINT_NAMES",
        "KEYPOINT_CONNECTION_RULES",
        "ADE20K_SEM_SEG_CATEGORIES",
    ],
    "detectron2.data.datasets.cityscapes": [
        "load_cityscapes_instances",
        "load_cityscapes_semantic",
    ],
    "detectron2.data.datasets.cityscapes_panoptic": ["load_cityscapes_panoptic"],
    "detectron2.data.datasets.coco": ["convert_to_coco_dict", "convert_to_coco_json"],
    "detectron2.data.datasets.coco_panoptic": [
        "load_coco_panoptic_json",
        "register_coco_panoptic",
        "register_coco_panoptic_separated",
    ],
    "detectron2.data.datasets.lvis": [
        "load_lvis_json",
        "register_lvis_instances",
        "get_lvis_instances_meta",
    ],
    "detectron2.data.datasets.lvis_v0_5_categories": ["CATEGORIES"],
    "detectron2.data.datasets.lvis_v1_categories": ["CATEGORIES"],
    "detectron2.data.datasets.lvis_v1_category_image_count": ["LVIS_CATEGORY_IMAGE_COUNT"],
    "detectron2.data.datasets.pascal_voc": [
        "load_voc_instances",
        "register_pascal_voc",
        "CLASS_NAMES",
    ],
    "detectron2.data.datasets.register_coco": [
        "register_coco_instances",
        "register_coco_panoptic_separated",
    ],
    "detectron2.evaluation.fast_eval_api": ["COCOeval_opt"],
    "detectron2.export": [
        "TracingAdapter",
        "dump_torchscript_IR",
        "scripting_with_instances",
        "Caffe2Tracer",
        "Caffe2Model",
        "add_export_config",
    ],
    "detectron2.export.api": ["Caffe2Tracer", "Caffe2Model", "add_export_config"],
    "detectron2.export.c10": ["Caffe2Boxes", "InstancesList", "Caffe2ROIPooler"],
    "detectron2.export.caffe2_export": ["export_onnx_model", "export_caffe2_detection_model"],
    "detectron2.export.caffe2_inference": ["ProtobufModel", "ProtobufDetectionModel"],
    "detectron2.export.caffe2_modeling": [
        "Caffe2GeneralizedRCNN",
        "Caffe2RetinaNet",
        "Caffe2MetaArch",
    ],
    "detectron2.export.caffe2_patch": ["ROIHeadsPatcher", "Caffe2CompatibleConverter"],
    "detectron2.export.flatten": ["TracingAdapter", "flatten_to_tuple"],
    "detectron2.export.shared": ["ScopedWS"],
    "detectron2.export.torchscript": ["scripting_with_instances", "dump_torchscript_IR"],
    "detectron2.export.torchscript_patch": ["patch_instances", "freeze_training_mode"],
    "detectron2.layers": [
        "DeformConv",
        "ModulatedDeformConv",
        "paste_masks_in_image",
        "ROIAlign",
        "roi_align",
        "ROIAlignRotated",
        "roi_align_rotated",
        "ciou_loss",
        "diou_loss",
    ],
    "detectron2.layers.deform_conv": ["DeformConv", "ModulatedDeformConv"],
    "detectron2.layers.losses": ["ciou_loss", "diou_loss"],
    "detectron2.layers.mask_ops": ["paste_masks_in_image"],
    "detectron2.layers.roi_align": ["ROIAlign", "roi_align"],
    "detectron2.layers.roi_align_rotated": ["ROIAlignRotated", "roi_align_rotated"],
    "detectron2.layers.rotated_boxes": ["pairwise_iou_rotated"],
    "detectron2.modeling": [
        "ANCHOR_GENERATOR_REGISTRY",
        "build_anchor_generator",
        "FPN",
        "MViT",
        "ResNet",
        "ResNetBlockBase",
        "SimpleFeaturePyramid",
        "SwinTransformer",
        "ViT",
        "build_resnet_backbone",
        "get_vit_lr_decay_rate",
        "make_stage",
        "FCOS",
        "PanopticFPN",
        "MMDetBackbone",
        "MMDetDetector",
        "PROPOSAL_GENERATOR_REGISTRY",
        "RPN_HEAD_REGISTRY",
        "build_proposal_generator",
        "build_rpn_head",
        "ROI_BOX_HEAD_REGISTRY",
        "ROI_HEADS_REGISTRY",
        "ROI_KEYPOINT_HEAD_REGISTRY",
        "ROI_MASK_HEAD_REGISTRY",
        "BaseKeypointRCNNHead",
        "BaseMaskRCNNHead",
        "FastRCNNOutputLayers",
        "ROIHeads",
        "StandardROIHeads",
        "build_box_head",
        "build_keypoint_head",
        "build_mask_head",
        "build_roi_heads",
        "DatasetMapperTTA",
    ],
    "detectron2.modeling.backbone": [
        "FPN",
        "RegNet",
        "BasicStem",
        "ResNet",
        "ResNetBlockBase",
        "build_resnet_backbone",
        "make_stage",
        "BottleneckBlock",
        "ViT",
        "SimpleFeaturePyramid",
        "get_vit_lr_decay_rate",
        "MViT",
        "SwinTransformer",
    ],
    "detectron2.modeling.backbone.mvit": ["MViT"],
    "detectron2.modeling.backbone.regnet": ["RegNet", "AnyNet"],
    "detectron2.modeling.backbone.swin": ["SwinTransformer"],
    "detectron2.modeling.backbone.utils": [
        "window_partition",
        "window_unpartition",
        "add_decomposed_rel_pos",
        "get_abs_pos",
        "PatchEmbed",
    ],
    "detectron2.modeling.backbone.vit": ["ViT", "SimpleFeaturePyramid", "get_vit_lr_decay_rate"],
    "detectron2.modeling.meta_arch": ["FCOS", "PanopticFPN", "DenseDetector"],
    "detectron2.modeling.meta_arch.dense_detector": ["DenseDetector"],
    "detectron2.modeling.meta_arch.fcos": ["FCOS", "FCOSHead"],
    "detectron2.modeling.meta_arch.panoptic_fpn": ["PanopticFPN"],
    "detectron2.modeling.mmdet_wrapper": ["MMDetBackbone", "MMDetDetector"],
    "detectron2.modeling.poolers": [
        "ROIPooler",
        "assign_boxes_to_levels",
        "convert_boxes_to_pooler_format",
    ],
    "detectron2.modeling.sampling": ["subsample_labels"],
    "detectron2.modeling.test_time_augmentation": ["DatasetMapperTTA", "GeneralizedRCNNWithTTA"],
    "detectron2.modeling.proposal_generator": [
        "PROPOSAL_GENERATOR_REGISTRY",
        "build_proposal_generator",
        "RPN_HEAD_REGISTRY",
        "build_rpn_head",
        "RPN",
        "StandardRPNHead",
    ],
    "detectron2.modeling.proposal_generator.build": [
        "PROPOSAL_GENERATOR_REGISTRY",
        "build_proposal_generator",
    ],
    "detectron2.modeling.proposal_generator.proposal_utils": [
        "find_top_rpn_proposals",
        "add_ground_truth_to_proposals",
    ],
    "detectron2.modeling.proposal_generator.rpn": [
        "RPN",
        "StandardRPNHead",
        "RPN_HEAD_REGISTRY",
        "build_rpn_head",
    ],
    "detectron2.modeling.proposal_generator.rrpn": ["RRPN"],
    "detectron2.modeling.roi_heads": [
        "ROI_BOX_HEAD_REGISTRY",
        "build_box_head",
        "FastRCNNConvFCHead",
        "ROI_KEYPOINT_HEAD_REGISTRY",
        "build_keypoint_head",
        "BaseKeypointRCNNHead",
        "KRCNNConvDeconvUpsampleHead",
        "ROI_MASK_HEAD_REGISTRY",
        "build_mask_head",
        "BaseMaskRCNNHead",
        "MaskRCNNConvUpsampleHead",
        "ROI_HEADS_REGISTRY",
        "ROIHeads",
        "Res5ROIHeads",
        "StandardROIHeads",
        "build_roi_heads",
        "select_foreground_proposals",
        "CascadeROIHeads",
        "RROIHeads",
        "FastRCNNOutputLayers",
    ],
    "detectron2.modeling.roi_heads.box_head": [
        "ROI_BOX_HEAD_REGISTRY",
        "FastRCNNConvFCHead",
        "build_box_head",
    ],
    "detectron2.modeling.roi_heads.cascade_rcnn": ["CascadeROIHeads"],
    "detectron2.modeling.roi_heads.fast_rcnn": [
        "FastRCNNOutputLayers",
        "fast_rcnn_inference",
        "fast_rcnn_inference_single_image",
    ],
    "detectron2.modeling.roi_heads.keypoint_head": [
        "ROI_KEYPOINT_HEAD_REGISTRY",
        "BaseKeypointRCNNHead",
        "KRCNNConvDeconvUpsampleHead",
        "build_keypoint_head",
        "keypoint_rcnn_loss",
        "keypoint_rcnn_inference",
    ],
    "detectron2.modeling.roi_heads.mask_head": [
        "ROI_MASK_HEAD_REGISTRY",
        "BaseMaskRCNNHead",
        "MaskRCNNConvUpsampleHead",
        "build_mask_head",
        "mask_rcnn_loss",
        "mask_rcnn_inference",
    ],
    "detectron2.modeling.roi_heads.roi_heads": [
        "ROI_HEADS_REGISTRY",
        "ROIHeads",
        "Res5ROIHeads",
        "StandardROIHeads",
        "build_roi_heads",
        "select_foreground_proposals",
        "select_proposals_with_visible_keypoints",
    ],
    "detectron2.modeling.roi_heads.rotated_fast_rcnn": [
        "RROIHeads",
        "RotatedFastRCNNOutputLayers",
        "fast_rcnn_inference_rotated",
    ],
    "detectron2.structures": ["pairwise_point_box_distance", "ROIMasks"],
    "detectron2.tracking": [
        "BaseTracker",
        "build_tracker_head",
        "TRACKER_HEADS_REGISTRY",
        "BBoxIOUTracker",
        "BaseHungarianTracker",
        "IOUWeightedHungarianBBoxIOUTracker",
        "VanillaHungarianBBoxIOUTracker",
        "create_prediction_pairs",
    ],
    "detectron2.tracking.base_tracker": [
        "BaseTracker",
        "build_tracker_head",
        "TRACKER_HEADS_REGISTRY",
    ],
    "detectron2.tracking.bbox_iou_tracker": ["BBoxIOUTracker"],
    "detectron2.tracking.hungarian_tracker": ["BaseHungarianTracker"],
    "detectron2.tracking.iou_weighted_hungarian_bbox_iou_tracker": [
        "IOUWeightedHungarianBBoxIOUTracker"
    ],
    "detectron2.tracking.utils": ["create_prediction_pairs"],
    "detectron2.tracking.vanilla_hungarian_bbox_iou_tracker": ["VanillaHungarianBBoxIOUTracker"],
    "detectron2.utils.video_visualizer": ["VideoVisualizer"],
}
NAME_CASES = [(path, name) for path, names in DETECTION_NAMES.items() for name in names]


@pytest.mark.parametrize(("path", "name"), NAME_CASES)
def test_detection_name_imports_and_using_it_is_a_one_line_usage_error(path, name):
    placeholder = getattr(importlib.import_module(_trainkit(path)), name)
    with pytest.raises(UsageError) as info:
        placeholder(object(), size=2)
    message = str(info.value)
    assert "\n" not in message
    # (a module named like its package's function: layers.roi_align, once imported)
    assert message.startswith(f"{placeholder.__name__.rsplit('.', 1)[-1]} is ")
    assert "keep using detectron2's" in message


@pytest.mark.parametrize("name", ["nms", "roi_align", "roi_align_rotated"])
def test_a_function_named_like_its_module_still_raises_after_the_module_is_imported(name):
    # Importing trainkit.layers.<name> makes the package's attribute that module.
    module = importlib.import_module(f"trainkit.layers.{name}")
    layers = importlib.import_module("trainkit.layers")
    for placeholder in (getattr(layers, name), getattr(module, name)):
        with pytest.raises(UsageError, match=f"^{name} is detection-only"):
            placeholder(object(), 0.5)


def test_category_tables_refuse_being_read():
    from trainkit.data.datasets.builtin_meta import COCO_CATEGORIES
    from trainkit.data.datasets.lvis_v1_categories import CATEGORIES

    with pytest.raises(UsageError, match="^COCO_CATEGORIES is not in trainkit"):
        [c["name"] for c in COCO_CATEGORIES]
    with pytest.raises(UsageError, match="^CATEGORIES is detection-only"):
        CATEGORIES[0]  # noqa: B018


@pytest.mark.parametrize(
    ("package", "module", "name"),
    [
        ("trainkit.modeling", "trainkit.modeling.roi_heads", "StandardROIHeads"),
        ("trainkit.modeling", "trainkit.modeling.roi_heads.roi_heads", "ROI_HEADS_REGISTRY"),
        ("trainkit.modeling", "trainkit.modeling.proposal_generator.rpn", "RPN_HEAD_REGISTRY"),
        ("trainkit.modeling", "trainkit.modeling.backbone.resnet", "ResNet"),
        ("trainkit.modeling", "trainkit.modeling.meta_arch.rcnn", "GeneralizedRCNN"),
        ("trainkit.modeling", "trainkit.modeling.test_time_augmentation", "DatasetMapperTTA"),
        ("trainkit.evaluation", "trainkit.evaluation.coco_evaluation", "COCOEvaluator"),
        ("trainkit.structures", "trainkit.structures.boxes", "Boxes"),
        ("trainkit.layers", "trainkit.layers.nms", "batched_nms"),
        ("trainkit.layers", "trainkit.layers.roi_align", "ROIAlign"),
        ("trainkit.data.datasets", "trainkit.data.datasets.coco", "register_coco_instances"),
        ("trainkit.export", "trainkit.export.flatten", "TracingAdapter"),
    ],
)
def test_a_placeholder_is_one_object_at_its_package_and_module_paths(package, module, name):
    # A project subclasses one and checks isinstance against the other.
    package_name = getattr(importlib.import_module(package), name)
    assert getattr(importlib.import_module(module), name) is package_name


def test_a_detection_projects_header_imports():
    # The module-level imports of a classification project started from a detector
    # (vindr-spinexr's), with detectron2 changed to trainkit.
    from trainkit.evaluation.fast_eval_api import COCOeval_opt  # noqa: F401
    from trainkit.modeling.poolers import ROIPooler  # noqa: F401
    from trainkit.modeling.roi_heads import (  # noqa: F401
        ROI_HEADS_REGISTRY,
        FastRCNNOutputLayers,
        StandardROIHeads,
    )
    from trainkit.modeling.roi_heads.fast_rcnn import fast_rcnn_inference  # noqa: F401
    from trainkit.utils.logger import create_small_table

    assert "AUC" in create_small_table({"AUC": 0.5})


def test_a_placeholder_module_loads_only_when_imported_by_its_own_path():
    # One fresh interpreter: `import trainkit.engine` loads no module of placeholders, nor do
    # all the real modules together; then each placeholder module loads only itself and the
    # placeholder packages above it (modeling.roi_heads for modeling.roi_heads.box_head).
    real = [_trainkit(path) for path in REAL]
    placeholders = [_trainkit(path) for path in PLACEHOLDER]
    code = f"""
import importlib, sys

def loaded():
    return sorted(name for name, module in list(sys.modules.items())
                  if vars(module).get("_PLACEHOLDER_MODULE", False))

import trainkit.engine
assert loaded() == [], ("import trainkit.engine loads", loaded())
for name in {real!r}:
    importlib.import_module(name)
assert loaded() == [], ("the real modules load", loaded())
for name in {placeholders!r}:
    before = set(loaded())
    importlib.import_module(name)
    parents = {{name.rsplit(".", k)[0] for k in range(name.count(".") + 1)}}
    assert set(loaded()) - before <= parents, (name, "loads", set(loaded()) - before - parents)
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
