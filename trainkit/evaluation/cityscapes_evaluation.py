"""detectron2's Cityscapes evaluators: placeholders that say why they are not in trainkit."""

from trainkit.utils.detection_only import detection_only

__all__ = ["CityscapesEvaluator", "CityscapesInstanceEvaluator", "CityscapesSemSegEvaluator"]

CityscapesEvaluator = detection_only(
    "CityscapesEvaluator",
    __name__,
    "the base of the Cityscapes evaluators",
    "port it to a trainkit DatasetEvaluator",
)
CityscapesInstanceEvaluator = detection_only(
    "CityscapesInstanceEvaluator",
    __name__,
    "Cityscapes instance-segmentation AP",
    "port it to a trainkit DatasetEvaluator",
)
CityscapesSemSegEvaluator = detection_only(
    "CityscapesSemSegEvaluator",
    __name__,
    "",
    "use trainkit.evaluation.SemSegEvaluator (mIoU, fwIoU, mACC, pACC) instead",
    reason="not in trainkit (it runs Cityscapes' official scripts, which trainkit does not wrap)",
)
