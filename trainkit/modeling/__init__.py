"""Model architectures: the META_ARCH registry, ``build_model`` and the built-in architecture.

Also detectron2's general modelling seams (``Backbone``, ``BACKBONE_REGISTRY``,
``build_backbone``, ``ShapeSpec``) and, as detection-only placeholders,
``GeneralizedRCNN``, ``ProposalNetwork``, ``RetinaNet`` and ``GeneralizedRCNNWithTTA``.
"""

from trainkit.layers import ShapeSpec

# Imported for its side effect: it registers the built-in "ImageClassifier" (the default
# MODEL.META_ARCHITECTURE), so build_model(get_cfg()) works after `import trainkit.modeling`.
from trainkit.modeling import image_classifier  # noqa: F401
from trainkit.modeling.backbone import BACKBONE_REGISTRY, Backbone, build_backbone
from trainkit.modeling.build import META_ARCH_REGISTRY, build_model, model_device
from trainkit.modeling.meta_arch import GeneralizedRCNN, ProposalNetwork, RetinaNet
from trainkit.modeling.test_time_augmentation import GeneralizedRCNNWithTTA

__all__ = [
    "ShapeSpec",
    "BACKBONE_REGISTRY",
    "META_ARCH_REGISTRY",
    "Backbone",
    "GeneralizedRCNN",
    "GeneralizedRCNNWithTTA",
    "ProposalNetwork",
    "RetinaNet",
    "build_backbone",
    "build_model",
    "model_device",
]
