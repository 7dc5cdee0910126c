"""detectron2's TorchScript export of models holding its structures: placeholders."""

from trainkit.export import dump_torchscript_IR, scripting_with_instances

__all__ = ["dump_torchscript_IR", "scripting_with_instances"]

_PLACEHOLDER_MODULE = True
