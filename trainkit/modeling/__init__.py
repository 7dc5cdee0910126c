"""Model architectures: the META_ARCH registry, ``build_model`` and the built-in architecture.

Also detectron2's general modelling seams (``Backbone``, ``BACKBONE_REGISTRY``,
``build_backbone``, ``ShapeSpec``), its semantic segmentation (``SemanticSegmentor``,
``SEM_SEG_HEADS_REGISTRY``, ``build_sem_seg_head``, ``sem_seg_postprocess``) and, as
detection-only placeholders, ``GeneralizedRCNN``, ``ProposalNetwork``, ``RetinaNet``,
``GeneralizedRCNNWithTTA`` and ``detector_postprocess``. The compile seam
(``compile_model``, ``call_compiled``, ``compile_stats``) and the padding rule of compiled
models (``ShapePlan``).
"""

from trainkit.layers import ShapeSpec

# Imported for its side effect: it registers the built-in "ImageClassifier" (the default
# MODEL.META_ARCHITECTURE), so build_model(get_cfg()) works after `import trainkit.modeling`.
from trainkit.modeling import image_classifier  # noqa: F401
from trainkit.modeling.backbone import BACKBONE_REGISTRY, Backbone, build_backbone
from trainkit.modeling.build import META_ARCH_REGISTRY, build_model, model_device
from trainkit.modeling.compile import CompileStats, call_compiled, compile_model, compile_stats
from trainkit.modeling.meta_arch import GeneralizedRCNN, ProposalNetwork, RetinaNet
from trainkit.modeling.meta_arch.semantic_seg import (
    SEM_SEG_HEADS_REGISTRY,
    SemanticSegmentor,
    build_sem_seg_head,
)
from trainkit.modeling.postprocessing import detector_postprocess, sem_seg_postprocess
from trainkit.modeling.shape_plan import ShapePlan
from trainkit.modeling.test_time_augmentation import GeneralizedRCNNWithTTA

__all__ = [
    "ShapeSpec",
    "BACKBONE_REGISTRY",
    "META_ARCH_REGISTRY",
    "SEM_SEG_HEADS_REGISTRY",
    "SemanticSegmentor",
    "Backbone",
    "GeneralizedRCNN",
    "GeneralizedRCNNWithTTA",
    "ProposalNetwork",
    "RetinaNet",
    "build_backbone",
    "build_model",
    "build_sem_seg_head",
    "detector_postprocess",
    "sem_seg_postprocess",
    "model_device",
    "CompileStats",
    "ShapePlan",
    "call_compiled",
    "compile_model",
    "compile_stats",
]
