"""detectron2's Caffe2 versions of its detectors: placeholders."""

from trainkit.export import _not_shipped

__all__ = [
    "Caffe2GeneralizedRCNN",
    "Caffe2MetaArch",
    "Caffe2RetinaNet",
    "assemble_rcnn_outputs_by_name",
    "convert_batched_inputs_to_c2_format",
]

_PLACEHOLDER_MODULE = True

Caffe2GeneralizedRCNN = _not_shipped("Caffe2GeneralizedRCNN", __name__)
Caffe2MetaArch = _not_shipped("Caffe2MetaArch", __name__)
Caffe2RetinaNet = _not_shipped("Caffe2RetinaNet", __name__)
assemble_rcnn_outputs_by_name = _not_shipped("assemble_rcnn_outputs_by_name", __name__)
convert_batched_inputs_to_c2_format = _not_shipped("convert_batched_inputs_to_c2_format", __name__)
