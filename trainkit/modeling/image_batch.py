"""Normalising images of different sizes and zero-padding them into one batch with a mask.

The eager input step the built-in classifiers (``ImageClassifier``, ``ViTClassifier``)
share: each image is normalised on its own, then placed at the top-left of a zero canvas
whose size is the batch's largest rounded up to a divisibility (or a shape plan's canvas),
with a mask that is 1 on real pixels. What a model computes from the padded batch does not
then depend on which images share it, as long as the model respects the mask.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from trainkit.modeling.compile import call_compiled
from trainkit.modeling.shape_plan import ShapePlan

__all__ = [
    "INPUT_NORMS",
    "classify_padded_batch",
    "masked_cross_entropy",
    "normalize_image",
    "pad_images",
    "to_device",
]

# The values of MODEL.CLASSIFIER.INPUT_NORM (see normalize_image).
INPUT_NORMS = ("image", "pixel")

_MIN_IMAGE_STD = 8.0  # the floor of the std input norm "image" divides by (0-255 units)


def normalize_image(
    image: Tensor, input_norm: str, pixel_mean: Tensor, pixel_std: Tensor
) -> Tensor:
    """Normalise one float image [3, h, w] (0-255) as ``input_norm`` says.

    Args:
        image: the image, float, RGB, 0-255, unpadded.
        input_norm: ``"pixel"`` subtracts ``pixel_mean`` and divides by ``pixel_std``
            ([3, 1, 1] each); ``"image"`` subtracts the image's own per-channel mean and
            divides by its overall standard deviation (floored at 8).

    Returns:
        The normalised image, same shape.
    """
    if input_norm == "pixel":
        return (image - pixel_mean) / pixel_std
    # Per-image standardisation over this image's pixels (padding cannot change it): the
    # background colour and contrast, drawn anew per image, are removed here rather than
    # learnt slowly by the first layers (a CNN on fixed-normalised shapes barely leaves
    # chance level in hundreds of iterations). One std over all channels keeps their
    # relative strength; its floor (0-255 units) keeps a flat image's noise small.
    centred = image - image.mean(dim=(1, 2), keepdim=True)
    return centred / centred.square().mean().sqrt().clamp(min=_MIN_IMAGE_STD)


def pad_images(
    images: Sequence[Tensor],
    normalize: Callable[[Tensor], Tensor],
    *,
    size_divisibility: int,
    plan: ShapePlan | None = None,
) -> tuple[Tensor, Tensor]:
    """Normalise each image and zero-pad them all into one batch.

    Args:
        images: non-empty; tensors [3, h, w] (uint8 or float, 0-255) on the model's device.
        normalize: maps one float image to its normalised self (e.g. :func:`normalize_image`).
        size_divisibility: the padded height and width are multiples of it (without a plan).
        plan: the padding plan of the current mode, or None.

    Returns:
        Images [N, 3, H, W] (float, normalised, zero padding) and a mask [N, 1, H, W] that is
        1 on real pixels and 0 on padding. H and W are the largest height and width in the
        batch rounded up to ``size_divisibility``; with a plan, N, H and W are the plan's
        (rows past the inputs are all padding).
    """
    height = max(image.shape[-2] for image in images)
    width = max(image.shape[-1] for image in images)
    if plan is None:
        size, num = size_divisibility, len(images)
        height, width = (math.ceil(v / size) * size for v in (height, width))
    else:
        num, height, width = plan.batch_shape(height, width, len(images))
    batch = images[0].new_zeros((num, 3, height, width), dtype=torch.float32)
    mask = batch.new_zeros((num, 1, height, width))
    for i, image in enumerate(images):
        h, w = image.shape[-2:]
        batch[i, :, :h, :w] = normalize(image.float())
        mask[i, :, :h, :w] = 1.0
    return batch, mask


def to_device(tensor: Tensor, device: torch.device) -> Tensor:
    """Return ``tensor`` on ``device`` without making the host wait for a CUDA device.

    A tensor already there (a device prefetcher delivered it) is returned as it is; a CPU
    tensor goes to CUDA from pinned memory (pinned here unless the loader pinned it), the
    only source a ``non_blocking`` copy does not wait on.
    """
    if tensor.device == device:
        return tensor
    if device.type == "cuda" and tensor.device.type == "cpu" and not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


def masked_cross_entropy(
    logits: Tensor, labels: Tensor, mask: Tensor, label_smoothing: float = 0.0
) -> Tensor:
    """Return the mean cross-entropy over a padded batch's real samples.

    Args:
        logits: [N, C].
        labels: int64 [N], anything for the rows a shape plan added (all padding).
        mask: [N, 1, H, W], 1 on real pixels: a row with none is an added sample.
        label_smoothing: as ``F.cross_entropy``'s.
    """
    weights = mask.flatten(1).amax(dim=1)  # 1 for a real sample, 0 for an added one
    losses = F.cross_entropy(logits, labels, label_smoothing=label_smoothing, reduction="none")
    return (losses * weights).sum() / weights.sum()


def classify_padded_batch(model: Any, batched_inputs: list[dict[str, Any]]) -> Any:
    """The ``forward`` of a classifier of padded image batches (the built-in classifiers).

    ``model`` has ``preprocess_image`` (images and mask) and the compiled methods
    ``eval_network(images, mask)`` and ``train_network(images, mask, labels)``.

    Returns:
        ``{"loss_cls": ...}`` in training mode, logits [N, C] in eval mode.

    Raises:
        KeyError: In training mode, if an input has no ``"label"``.
    """
    images, mask = model.preprocess_image(batched_inputs)
    if not model.training:
        return call_compiled(model, "eval_network", images, mask)[: len(batched_inputs)]
    try:
        labels = [int(inp["label"]) for inp in batched_inputs]
    except KeyError:
        raise KeyError(
            f"{type(model).__name__} in training mode needs a 'label' in every input dict; use "
            "a mapper that keeps it (ClassificationDatasetMapper) or call model.eval()."
        ) from None
    labels += [0] * (images.shape[0] - len(labels))  # the added rows' weight is 0
    # Built on the CPU and copied without a wait (torch.as_tensor(..., device=cuda) would
    # copy from pageable memory, which blocks the host until the device catches up).
    targets = to_device(torch.tensor(labels), images.device)
    if torch.is_grad_enabled():
        loss = call_compiled(model, "train_network", images, mask, targets)
    else:
        # Training mode without gradients (TEST.VAL_LOSS, PreciseBN) runs eager: in the
        # compiled function it would be a second graph per shape (Dynamo guards on it).
        loss = model.train_network(images, mask, targets)
    return {"loss_cls": loss}
