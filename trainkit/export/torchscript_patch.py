"""detectron2's patches that let TorchScript handle its structures: placeholders."""

from trainkit.export import _not_shipped

__all__ = [
    "freeze_training_mode",
    "patch_builtin_len",
    "patch_instances",
    "patch_nonscriptable_classes",
]

_PLACEHOLDER_MODULE = True

freeze_training_mode = _not_shipped("freeze_training_mode", __name__)
patch_builtin_len = _not_shipped("patch_builtin_len", __name__)
patch_instances = _not_shipped("patch_instances", __name__)
patch_nonscriptable_classes = _not_shipped("patch_nonscriptable_classes", __name__)
