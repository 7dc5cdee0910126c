"""detectron2's meta_arch package path: registries, ``build_model``, semantic segmentation.

Its detectors (``GeneralizedRCNN``, ``ProposalNetwork``, ``RetinaNet``, ``FCOS``,
``PanopticFPN``, ``DenseDetector``) are detection-only placeholders made in this file: they
import, and using one says why not. Their modules (``meta_arch.rcnn``, ...) re-export them and
load only when imported by their own path.
"""

from trainkit.modeling.meta_arch.build import META_ARCH_REGISTRY, build_model
from trainkit.modeling.meta_arch.semantic_seg import (
    SEM_SEG_HEADS_REGISTRY,
    SemanticSegmentor,
    SemSegFPNHead,
    build_sem_seg_head,
)
from trainkit.utils.detection_only import detection_only

__all__ = [
    "FCOS",
    "META_ARCH_REGISTRY",
    "SEM_SEG_HEADS_REGISTRY",
    "DenseDetector",
    "GeneralizedRCNN",
    "PanopticFPN",
    "ProposalNetwork",
    "RetinaNet",
    "SemSegFPNHead",
    "SemanticSegmentor",
    "build_model",
    "build_sem_seg_head",
]

_ADVICE = "register a model of your own with @META_ARCH_REGISTRY.register()"

GeneralizedRCNN = detection_only(
    "GeneralizedRCNN",
    __name__,
    "the R-CNN family of detectors: backbone, proposals and box/mask/keypoint heads",
    _ADVICE,
)
ProposalNetwork = detection_only(
    "ProposalNetwork", __name__, "a region proposal network trained on its own", _ADVICE
)
RetinaNet = detection_only("RetinaNet", __name__, "a one-stage dense box detector", _ADVICE)
FCOS = detection_only("FCOS", __name__, "an anchor-free one-stage box detector", _ADVICE)
DenseDetector = detection_only(
    "DenseDetector", __name__, "the base of detectron2's one-stage detectors", _ADVICE
)
PanopticFPN = detection_only(
    "PanopticFPN", __name__, "panoptic segmentation by an R-CNN and a semantic head", _ADVICE
)
