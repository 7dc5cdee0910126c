"""Helpers of detectron2's transformer backbones: placeholders (the backbones are not shipped)."""

from trainkit.modeling.backbone import _not_shipped

__all__ = [
    "PatchEmbed",
    "add_decomposed_rel_pos",
    "get_abs_pos",
    "window_partition",
    "window_unpartition",
]

_PLACEHOLDER_MODULE = True

PatchEmbed = _not_shipped("PatchEmbed", "ViT", __name__)
add_decomposed_rel_pos = _not_shipped("add_decomposed_rel_pos", "ViT", __name__)
get_abs_pos = _not_shipped("get_abs_pos", "ViT", __name__)
window_partition = _not_shipped("window_partition", "ViT", __name__)
window_unpartition = _not_shipped("window_unpartition", "ViT", __name__)
