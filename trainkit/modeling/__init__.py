"""Model architectures: the META_ARCH registry, ``build_model`` and the built-in architecture.

Also detectron2's general modelling seams (``Backbone``, ``BACKBONE_REGISTRY``,
``build_backbone``, ``ShapeSpec``), its semantic segmentation (``SemanticSegmentor``,
``SEM_SEG_HEADS_REGISTRY``, ``build_sem_seg_head``, ``sem_seg_postprocess``), the compile
seam (``compile_model``, ``call_compiled``, ``compile_stats``), the padding rule of
compiled models (``ShapePlan``) and the sharding seam (``shard_model``, ``model_blocks``,
``checkpoint_activations``, ``gathered_parameters``, ``state_bytes_per_process``).

The detection names detectron2 exports here (its detectors, ROI heads, proposal generators,
anchor generators, test-time augmentation, mmdetection wrappers, ``detector_postprocess``)
are detection-only placeholders. Those of ``roi_heads``, ``proposal_generator`` and the
modules below are made in this file, so importing this package loads none of the modules of
placeholders; those modules re-export them when imported by their own path.
"""

from trainkit.layers import ShapeSpec

# Imported for their side effect: they register the built-in "ImageClassifier" (the default
# MODEL.META_ARCHITECTURE) and "ViTClassifier", so build_model(get_cfg()) works after
# `import trainkit.modeling`.
from trainkit.modeling import image_classifier, vit_classifier  # noqa: F401
from trainkit.modeling.backbone import (
    BACKBONE_REGISTRY,
    FPN,
    Backbone,
    MViT,
    ResNet,
    ResNetBlockBase,
    SimpleFeaturePyramid,
    SwinTransformer,
    ViT,
    build_backbone,
    build_resnet_backbone,
    get_vit_lr_decay_rate,
    make_stage,
)
from trainkit.modeling.build import META_ARCH_REGISTRY, build_model, model_device
from trainkit.modeling.compile import CompileStats, call_compiled, compile_model, compile_stats
from trainkit.modeling.meta_arch import (
    FCOS,
    GeneralizedRCNN,
    PanopticFPN,
    ProposalNetwork,
    RetinaNet,
)
from trainkit.modeling.meta_arch.semantic_seg import (
    SEM_SEG_HEADS_REGISTRY,
    SemanticSegmentor,
    build_sem_seg_head,
)
from trainkit.modeling.postprocessing import detector_postprocess, sem_seg_postprocess
from trainkit.modeling.shape_plan import ShapePlan
from trainkit.modeling.sharding import (
    check_optimizer_of_sharded_model,
    checkpoint_activations,
    gathered_parameters,
    model_blocks,
    shard_from_config,
    shard_model,
    state_bytes_per_process,
)
from trainkit.utils.detection_only import detection_only

__all__ = [
    "ShapeSpec",
    "ANCHOR_GENERATOR_REGISTRY",
    "BACKBONE_REGISTRY",
    "FCOS",
    "FPN",
    "META_ARCH_REGISTRY",
    "PROPOSAL_GENERATOR_REGISTRY",
    "ROI_BOX_HEAD_REGISTRY",
    "ROI_HEADS_REGISTRY",
    "ROI_KEYPOINT_HEAD_REGISTRY",
    "ROI_MASK_HEAD_REGISTRY",
    "RPN_HEAD_REGISTRY",
    "SEM_SEG_HEADS_REGISTRY",
    "SemanticSegmentor",
    "Backbone",
    "BaseKeypointRCNNHead",
    "BaseMaskRCNNHead",
    "DatasetMapperTTA",
    "FastRCNNOutputLayers",
    "GeneralizedRCNN",
    "GeneralizedRCNNWithTTA",
    "MMDetBackbone",
    "MMDetDetector",
    "MViT",
    "PanopticFPN",
    "ProposalNetwork",
    "ROIHeads",
    "ResNet",
    "ResNetBlockBase",
    "RetinaNet",
    "SimpleFeaturePyramid",
    "StandardROIHeads",
    "SwinTransformer",
    "ViT",
    "build_anchor_generator",
    "build_backbone",
    "build_box_head",
    "build_keypoint_head",
    "build_mask_head",
    "build_model",
    "build_proposal_generator",
    "build_resnet_backbone",
    "build_roi_heads",
    "build_rpn_head",
    "build_sem_seg_head",
    "detector_postprocess",
    "get_vit_lr_decay_rate",
    "make_stage",
    "sem_seg_postprocess",
    "model_device",
    "CompileStats",
    "ShapePlan",
    "call_compiled",
    "compile_model",
    "compile_stats",
    "check_optimizer_of_sharded_model",
    "checkpoint_activations",
    "gathered_parameters",
    "model_blocks",
    "shard_from_config",
    "shard_model",
    "state_bytes_per_process",
]

# modeling.anchor_generator
_ANCHORS = "anchor boxes for region proposals and one-stage detectors"
ANCHOR_GENERATOR_REGISTRY = detection_only("ANCHOR_GENERATOR_REGISTRY", __name__, _ANCHORS)
build_anchor_generator = detection_only("build_anchor_generator", __name__, _ANCHORS)

# modeling.proposal_generator
_PROPOSALS = "region proposals for two-stage detectors"
PROPOSAL_GENERATOR_REGISTRY = detection_only("PROPOSAL_GENERATOR_REGISTRY", __name__, _PROPOSALS)
build_proposal_generator = detection_only("build_proposal_generator", __name__, _PROPOSALS)
RPN_HEAD_REGISTRY = detection_only("RPN_HEAD_REGISTRY", __name__, _PROPOSALS)
build_rpn_head = detection_only("build_rpn_head", __name__, _PROPOSALS)

# modeling.roi_heads
_ROI_HEADS = "the per-region heads of R-CNN detectors"
ROI_HEADS_REGISTRY = detection_only("ROI_HEADS_REGISTRY", __name__, _ROI_HEADS)
ROIHeads = detection_only("ROIHeads", __name__, _ROI_HEADS)
StandardROIHeads = detection_only("StandardROIHeads", __name__, _ROI_HEADS)
build_roi_heads = detection_only("build_roi_heads", __name__, _ROI_HEADS)
_BOX_HEAD = "the box head of R-CNN detectors"
ROI_BOX_HEAD_REGISTRY = detection_only("ROI_BOX_HEAD_REGISTRY", __name__, _BOX_HEAD)
build_box_head = detection_only("build_box_head", __name__, _BOX_HEAD)
FastRCNNOutputLayers = detection_only("FastRCNNOutputLayers", __name__, _BOX_HEAD)
_MASK_HEAD = "the mask head of Mask R-CNN"
ROI_MASK_HEAD_REGISTRY = detection_only("ROI_MASK_HEAD_REGISTRY", __name__, _MASK_HEAD)
BaseMaskRCNNHead = detection_only("BaseMaskRCNNHead", __name__, _MASK_HEAD)
build_mask_head = detection_only("build_mask_head", __name__, _MASK_HEAD)
_KEYPOINT_HEAD = "the keypoint head of Keypoint R-CNN"
ROI_KEYPOINT_HEAD_REGISTRY = detection_only("ROI_KEYPOINT_HEAD_REGISTRY", __name__, _KEYPOINT_HEAD)
BaseKeypointRCNNHead = detection_only("BaseKeypointRCNNHead", __name__, _KEYPOINT_HEAD)
build_keypoint_head = detection_only("build_keypoint_head", __name__, _KEYPOINT_HEAD)

# modeling.test_time_augmentation
_TTA_ADVICE = "evaluate without it (drop the TTA hook of train_net.py's test_with_TTA)"
GeneralizedRCNNWithTTA = detection_only(
    "GeneralizedRCNNWithTTA", __name__, "test-time augmentation of R-CNN detectors", _TTA_ADVICE
)
DatasetMapperTTA = detection_only(
    "DatasetMapperTTA", __name__, "test-time augmentation of R-CNN detectors", _TTA_ADVICE
)

# modeling.mmdet_wrapper
_MMDET_REASON = "not in trainkit (it wraps mmdetection's models, which trainkit does not use)"
_MMDET_ADVICE = "register your own model or backbone wrapping mmdetection's"
MMDetBackbone = detection_only("MMDetBackbone", __name__, "", _MMDET_ADVICE, reason=_MMDET_REASON)
MMDetDetector = detection_only("MMDetDetector", __name__, "", _MMDET_ADVICE, reason=_MMDET_REASON)
