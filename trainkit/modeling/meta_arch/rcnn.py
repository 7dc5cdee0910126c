"""detectron2's R-CNN meta-architectures, as detection-only placeholders."""

from trainkit.utils.detection_only import detection_only

__all__ = ["GeneralizedRCNN", "ProposalNetwork"]

GeneralizedRCNN = detection_only(
    "GeneralizedRCNN",
    __name__,
    "the R-CNN family of detectors: backbone, proposals and box/mask/keypoint heads",
    "register a model of your own with @META_ARCH_REGISTRY.register()",
)
ProposalNetwork = detection_only(
    "ProposalNetwork",
    __name__,
    "a region proposal network trained on its own",
    "register a model of your own with @META_ARCH_REGISTRY.register()",
)
