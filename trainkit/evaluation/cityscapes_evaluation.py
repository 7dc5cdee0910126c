"""detectron2's Cityscapes evaluators: placeholders that say why they are not in trainkit."""

from trainkit.evaluation import (
    CityscapesEvaluator,
    CityscapesInstanceEvaluator,
    CityscapesSemSegEvaluator,
)

__all__ = ["CityscapesEvaluator", "CityscapesInstanceEvaluator", "CityscapesSemSegEvaluator"]

_PLACEHOLDER_MODULE = True
