"""detectron2's export of detection models to Caffe2 and ONNX: placeholders."""

from trainkit.export import _not_shipped

__all__ = ["export_caffe2_detection_model", "export_onnx_model", "run_and_save_graph"]

_PLACEHOLDER_MODULE = True

export_caffe2_detection_model = _not_shipped("export_caffe2_detection_model", __name__)
export_onnx_model = _not_shipped("export_onnx_model", __name__)
run_and_save_graph = _not_shipped("run_and_save_graph", __name__)
