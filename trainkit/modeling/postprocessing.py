"""Post-processing of model outputs back to the input resolution (``sem_seg_postprocess``)."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from trainkit.utils.detection_only import detection_only

__all__ = ["detector_postprocess", "sem_seg_postprocess"]


def sem_seg_postprocess(
    result: torch.Tensor, img_size: tuple[int, int], output_height: int, output_width: int
) -> torch.Tensor:
    """Undo batching and resizing of per-pixel scores.

    Args:
        result: scores ``(C, Hp, Wp)`` over the padded batch image.
        img_size: ``(h, w)`` of the image before padding (``ImageList.image_sizes[i]``).
        output_height, output_width: the resolution to return, usually the original
            image's (the record's ``height`` and ``width``).

    Returns:
        The scores cropped to ``img_size`` and resized bilinearly to
        ``(C, output_height, output_width)``.
    """
    cropped = result[:, : img_size[0], : img_size[1]].expand(1, -1, -1, -1)
    resized = F.interpolate(
        cropped, size=(output_height, output_width), mode="bilinear", align_corners=False
    )
    return resized[0]


detector_postprocess = detection_only(
    "detector_postprocess", __name__, "rescaling detected boxes, masks and keypoints"
)
