"""detectron2's tables of built-in dataset categories: placeholders.

Reading one (iterating, indexing) raises a one-line error; give your dataset's classes to
``MetadataCatalog.get(name).set(thing_classes=...)`` (or ``stuff_classes``) yourself.
"""

from trainkit.utils.detection_only import detection_only

__all__ = [
    "ADE20K_SEM_SEG_CATEGORIES",
    "COCO_CATEGORIES",
    "COCO_PERSON_KEYPOINT_FLIP_MAP",
    "COCO_PERSON_KEYPOINT_NAMES",
    "KEYPOINT_CONNECTION_RULES",
]

_PLACEHOLDER_MODULE = True

_REASON = "not in trainkit (it is one of detectron2's tables of built-in dataset categories)"
_ADVICE = "set your dataset's classes with MetadataCatalog.get(name).set(...)"


def _table(name: str) -> type:
    return detection_only(name, __name__, "", _ADVICE, reason=_REASON)


COCO_CATEGORIES = _table("COCO_CATEGORIES")
COCO_PERSON_KEYPOINT_NAMES = _table("COCO_PERSON_KEYPOINT_NAMES")
COCO_PERSON_KEYPOINT_FLIP_MAP = _table("COCO_PERSON_KEYPOINT_FLIP_MAP")
KEYPOINT_CONNECTION_RULES = _table("KEYPOINT_CONNECTION_RULES")
ADE20K_SEM_SEG_CATEGORIES = _table("ADE20K_SEM_SEG_CATEGORIES")
