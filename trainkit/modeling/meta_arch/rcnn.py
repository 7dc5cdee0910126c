"""detectron2's R-CNN meta-architectures, as detection-only placeholders."""

from trainkit.modeling.meta_arch import GeneralizedRCNN, ProposalNetwork

__all__ = ["GeneralizedRCNN", "ProposalNetwork"]

_PLACEHOLDER_MODULE = True
