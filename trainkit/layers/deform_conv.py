"""detectron2's deformable convolutions: placeholders (its own CUDA operator is not shipped).

torchvision has the operator (``torchvision.ops.DeformConv2d``, ``deform_conv2d``).
"""

from trainkit.layers import DeformConv, ModulatedDeformConv
from trainkit.utils.detection_only import detection_only

__all__ = ["DeformConv", "ModulatedDeformConv", "deform_conv", "modulated_deform_conv"]

_PLACEHOLDER_MODULE = True

_REASON = "not in trainkit (it is detectron2's own compiled CUDA operator)"
_ADVICE = "use torchvision.ops.deform_conv2d"

deform_conv = detection_only("deform_conv", __name__, "", _ADVICE, reason=_REASON)
modulated_deform_conv = detection_only(
    "modulated_deform_conv", __name__, "", _ADVICE, reason=_REASON
)
