"""detectron2's RegNet backbones: placeholders, as trainkit does not ship them."""

from trainkit.modeling.backbone import RegNet, _not_shipped

__all__ = [
    "AnyNet",
    "RegNet",
    "ResBasicBlock",
    "ResBottleneckBlock",
    "ResStem",
    "SimpleStem",
    "VanillaBlock",
]

_PLACEHOLDER_MODULE = True

AnyNet = _not_shipped("AnyNet", "RegNet", __name__)
ResStem = _not_shipped("ResStem", "RegNet", __name__)
SimpleStem = _not_shipped("SimpleStem", "RegNet", __name__)
VanillaBlock = _not_shipped("VanillaBlock", "RegNet", __name__)
ResBasicBlock = _not_shipped("ResBasicBlock", "RegNet", __name__)
ResBottleneckBlock = _not_shipped("ResBottleneckBlock", "RegNet", __name__)
