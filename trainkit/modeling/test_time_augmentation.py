"""detectron2's test-time augmentation of R-CNN models, a detection-only placeholder."""

from trainkit.utils.detection_only import detection_only

__all__ = ["GeneralizedRCNNWithTTA"]

GeneralizedRCNNWithTTA = detection_only(
    "GeneralizedRCNNWithTTA",
    __name__,
    "test-time augmentation of R-CNN detectors",
    "evaluate without it (drop the TTA hook of train_net.py's test_with_TTA)",
)
