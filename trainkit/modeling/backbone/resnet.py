"""detectron2's ResNet backbones: placeholders, as trainkit does not ship them.

Projects import ``ResNet``, ``BasicStem``, ``BottleneckBlock``, ... from here to assemble
their own backbones (DeepLab's ``build_resnet_deeplab_backbone``). The names import, so that
such a module loads; building one raises a one-line error saying what to do instead.
"""

from trainkit.modeling.backbone import (
    BasicStem,
    BottleneckBlock,
    ResNet,
    ResNetBlockBase,
    _not_shipped,
    build_resnet_backbone,
    make_stage,
)

__all__ = [
    "BasicBlock",
    "BasicStem",
    "BottleneckBlock",
    "DeformBottleneckBlock",
    "ResNet",
    "ResNetBlockBase",
    "build_resnet_backbone",
    "make_stage",
]

_PLACEHOLDER_MODULE = True

BasicBlock = _not_shipped("BasicBlock", "ResNet", __name__)
DeformBottleneckBlock = _not_shipped("DeformBottleneckBlock", "ResNet", __name__)
