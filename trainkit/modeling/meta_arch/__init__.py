"""detectron2's meta_arch package path: registries, ``build_model``, semantic segmentation.

Its detectors (``GeneralizedRCNN``, ``ProposalNetwork``, ``RetinaNet``) are detection-only
placeholders: they import, and using one says why not.
"""

from trainkit.modeling.meta_arch.build import META_ARCH_REGISTRY, build_model
from trainkit.modeling.meta_arch.rcnn import GeneralizedRCNN, ProposalNetwork
from trainkit.modeling.meta_arch.retinanet import RetinaNet
from trainkit.modeling.meta_arch.semantic_seg import (
    SEM_SEG_HEADS_REGISTRY,
    SemanticSegmentor,
    SemSegFPNHead,
    build_sem_seg_head,
)

__all__ = [
    "META_ARCH_REGISTRY",
    "SEM_SEG_HEADS_REGISTRY",
    "GeneralizedRCNN",
    "ProposalNetwork",
    "RetinaNet",
    "SemSegFPNHead",
    "SemanticSegmentor",
    "build_model",
    "build_sem_seg_head",
]
