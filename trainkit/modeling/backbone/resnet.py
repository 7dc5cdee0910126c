"""detectron2's ResNet backbones: placeholders, as trainkit does not ship them.

Projects import ``ResNet``, ``BasicStem``, ``BottleneckBlock``, ... from here to assemble
their own backbones (DeepLab's ``build_resnet_deeplab_backbone``). The names import, so that
such a module loads; building one raises a one-line error saying what to do instead.
"""

from trainkit.utils.detection_only import detection_only

__all__ = [
    "BasicBlock",
    "BasicStem",
    "BottleneckBlock",
    "DeformBottleneckBlock",
    "ResNet",
    "build_resnet_backbone",
    "make_stage",
]

_REASON = "one of detectron2's ResNet backbone parts, which trainkit does not ship"
_ADVICE = (
    "register your own backbone in BACKBONE_REGISTRY (e.g. wrapping a torchvision or timm "
    "ResNet in trainkit.modeling.Backbone)"
)


def _placeholder(name: str) -> type:
    return detection_only(name, __name__, "", _ADVICE, reason=_REASON)


BasicBlock = _placeholder("BasicBlock")
BasicStem = _placeholder("BasicStem")
BottleneckBlock = _placeholder("BottleneckBlock")
DeformBottleneckBlock = _placeholder("DeformBottleneckBlock")
ResNet = _placeholder("ResNet")
build_resnet_backbone = _placeholder("build_resnet_backbone")
make_stage = _placeholder("make_stage")
