"""detectron2's export of its models to Caffe2, ONNX and TorchScript: placeholders.

trainkit does not ship it: Caffe2 is gone from PyTorch, and the TorchScript and tracing
helpers exist to carry detectron2's structures (``Instances``, ``Boxes``) through a trace.
Export a trainkit model with ``torch.export`` or ``torch.jit`` directly. The names import, as
in detectron2; using one raises a one-line error.
"""

from trainkit.utils.detection_only import detection_only

__all__ = [
    "Caffe2Model",
    "Caffe2Tracer",
    "TracingAdapter",
    "add_export_config",
    "dump_torchscript_IR",
    "scripting_with_instances",
]

_PLACEHOLDER_MODULE = True

_REASON = "not in trainkit (it is part of detectron2's export of its detection models)"
_ADVICE = "export your model with torch.export or torch.jit directly"


def _not_shipped(name: str, module: str = __name__) -> type:
    # Also used by this package's modules for the names only they export.
    return detection_only(name, module, "", _ADVICE, reason=_REASON)


Caffe2Model = _not_shipped("Caffe2Model")
Caffe2Tracer = _not_shipped("Caffe2Tracer")
add_export_config = _not_shipped("add_export_config")
TracingAdapter = _not_shipped("TracingAdapter")
dump_torchscript_IR = _not_shipped("dump_torchscript_IR")
scripting_with_instances = _not_shipped("scripting_with_instances")
