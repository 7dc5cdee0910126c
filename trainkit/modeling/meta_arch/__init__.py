"""detectron2's meta-architecture package path: the registry and ``build_model``.

Its detectors (``GeneralizedRCNN``, ``ProposalNetwork``, ``RetinaNet``) are detection-only
placeholders: they import, and using one says why not.
"""

from trainkit.modeling.meta_arch.build import META_ARCH_REGISTRY, build_model
from trainkit.modeling.meta_arch.rcnn import GeneralizedRCNN, ProposalNetwork
from trainkit.modeling.meta_arch.retinanet import RetinaNet

__all__ = ["META_ARCH_REGISTRY", "GeneralizedRCNN", "ProposalNetwork", "RetinaNet", "build_model"]
