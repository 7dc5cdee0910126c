"""detectron2's test-time augmentation of R-CNN models, detection-only placeholders."""

from trainkit.modeling import DatasetMapperTTA, GeneralizedRCNNWithTTA

__all__ = ["DatasetMapperTTA", "GeneralizedRCNNWithTTA"]

_PLACEHOLDER_MODULE = True
