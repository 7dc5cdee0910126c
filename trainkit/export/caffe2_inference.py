"""detectron2's Caffe2 inference of exported detection models: placeholders."""

from trainkit.export import _not_shipped

__all__ = ["ProtobufDetectionModel", "ProtobufModel"]

_PLACEHOLDER_MODULE = True

ProtobufDetectionModel = _not_shipped("ProtobufDetectionModel", __name__)
ProtobufModel = _not_shipped("ProtobufModel", __name__)
