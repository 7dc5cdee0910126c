"""detectron2's region proposal network: detection-only placeholders."""

from trainkit.modeling.proposal_generator import (
    RPN,
    RPN_HEAD_REGISTRY,
    StandardRPNHead,
    build_rpn_head,
)

__all__ = ["RPN", "RPN_HEAD_REGISTRY", "StandardRPNHead", "build_rpn_head"]

_PLACEHOLDER_MODULE = True
