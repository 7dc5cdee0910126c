"""detectron2's patches of its detectors for Caffe2 export: placeholders."""

from trainkit.export import _not_shipped

__all__ = [
    "Caffe2CompatibleConverter",
    "GenericMixin",
    "ROIHeadsPatcher",
    "patch",
    "patch_generalized_rcnn",
]

_PLACEHOLDER_MODULE = True

Caffe2CompatibleConverter = _not_shipped("Caffe2CompatibleConverter", __name__)
GenericMixin = _not_shipped("GenericMixin", __name__)
ROIHeadsPatcher = _not_shipped("ROIHeadsPatcher", __name__)
patch = _not_shipped("patch", __name__)
patch_generalized_rcnn = _not_shipped("patch_generalized_rcnn", __name__)
