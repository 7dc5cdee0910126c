"""detectron2's Cityscapes datasets: placeholders, as trainkit does not register them."""

from trainkit.utils.detection_only import detection_only

__all__ = ["load_cityscapes_instances", "load_cityscapes_semantic"]

_PLACEHOLDER_MODULE = True

load_cityscapes_instances = detection_only(
    "load_cityscapes_instances", __name__, "reading Cityscapes instance annotations into records"
)
load_cityscapes_semantic = detection_only(
    "load_cityscapes_semantic",
    __name__,
    "",
    "register the dataset with DatasetCatalog.register(name, lambda: load_sem_seg(gt_root, "
    "image_root)) from trainkit.data.datasets",
    reason="not in trainkit (it reads Cityscapes' own file layout, which trainkit does not wrap)",
)
