"""detectron2's Caffe2 export API: placeholders (Caffe2 is gone from PyTorch)."""

from trainkit.export import Caffe2Model, Caffe2Tracer, add_export_config

__all__ = ["Caffe2Model", "Caffe2Tracer", "add_export_config"]

_PLACEHOLDER_MODULE = True
