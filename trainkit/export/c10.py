"""detectron2's Caffe2-compatible versions of its detection layers: placeholders."""

from trainkit.export import _not_shipped

__all__ = [
    "Caffe2Boxes",
    "Caffe2Compatible",
    "Caffe2FastRCNNOutputsInference",
    "Caffe2KeypointRCNNInference",
    "Caffe2MaskRCNNInference",
    "Caffe2ROIPooler",
    "Caffe2RPN",
    "InstancesList",
]

_PLACEHOLDER_MODULE = True

Caffe2Boxes = _not_shipped("Caffe2Boxes", __name__)
Caffe2Compatible = _not_shipped("Caffe2Compatible", __name__)
Caffe2FastRCNNOutputsInference = _not_shipped("Caffe2FastRCNNOutputsInference", __name__)
Caffe2KeypointRCNNInference = _not_shipped("Caffe2KeypointRCNNInference", __name__)
Caffe2MaskRCNNInference = _not_shipped("Caffe2MaskRCNNInference", __name__)
Caffe2ROIPooler = _not_shipped("Caffe2ROIPooler", __name__)
Caffe2RPN = _not_shipped("Caffe2RPN", __name__)
InstancesList = _not_shipped("InstancesList", __name__)
