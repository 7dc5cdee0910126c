"""Loading weights whose names differ from the model's by a prefix: suffix matching.

detectron2's ``align_and_update_state_dicts``, which ``Checkpointer.load`` applies to a path
ending in ``?matching_heuristics=True``: weights saved from a bare backbone
(``layer1.weight``) load into a model that nests it (``backbone.body.layer1.weight``).
detectron2 also renames Caffe2 (Detectron) blobs first; those weights are detection models
and are not supported here.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from trainkit.checkpoint._files import CheckpointError
from trainkit.utils.detection_only import detection_only

__all__ = ["align_and_update_state_dicts", "convert_basic_c2_names", "convert_c2_detectron_names"]

logger = logging.getLogger(__name__)


def _looks_like_caffe2(keys: list[str]) -> bool:
    # Detectron blobs are flat names such as "res2_0_branch2a_w", never dotted paths.
    return (
        bool(keys)
        and not any("." in k for k in keys)
        and any(k.endswith(("_w", "_b", "_s")) for k in keys)
    )


def align_and_update_state_dicts(
    model_state_dict: Mapping[str, Any],
    ckpt_state_dict: Mapping[str, Any],
    c2_conversion: bool = True,
) -> dict[str, Any]:
    """Rename the checkpoint's weights to the model's keys they end.

    Each model key takes the longest checkpoint key that equals it or is a suffix of it
    after a ``.`` (``res.layer2.weight`` takes ``res.layer2.weight`` over ``layer2.weight``).
    A match whose shape differs from the model's is left out, with a warning. Checkpoint
    keys that no model key takes are kept under their own names (a load then reports them
    as unexpected).

    Args:
        model_state_dict: the model's ``state_dict()`` (only its keys and shapes are read).
        ckpt_state_dict: the weights to load.
        c2_conversion: detectron2 renames Caffe2 blob names first when True; here such
            weights are refused and other names are matched as they are.

    Returns:
        A new dict of the checkpoint's tensors under the model's names.

    Raises:
        CheckpointError: If one checkpoint key is the best match of several model keys (the
            matching is ambiguous), or the weights are Caffe2 (Detectron) blobs.
    """
    ckpt_keys = sorted(ckpt_state_dict)
    if c2_conversion and _looks_like_caffe2(ckpt_keys):
        raise CheckpointError(
            "these weights have Caffe2 (Detectron) blob names, which belong to detectron2's "
            "detection models and are not supported; load a torch state dict of your model."
        )
    result: dict[str, Any] = {}
    taken_by: dict[str, str] = {}
    for model_key in sorted(model_state_dict):
        found = [k for k in ckpt_keys if model_key == k or model_key.endswith("." + k)]
        if not found:
            continue
        ckpt_key = max(found, key=len)
        value = ckpt_state_dict[ckpt_key]
        model_shape = tuple(getattr(model_state_dict[model_key], "shape", ()))
        if tuple(getattr(value, "shape", ())) != model_shape:
            logger.warning(
                "Not loading %s into %s: shape %s in the checkpoint, %s in the model",
                ckpt_key,
                model_key,
                tuple(value.shape),
                model_shape,
            )
            continue
        if ckpt_key in taken_by:
            raise CheckpointError(
                f"checkpoint key {ckpt_key!r} matches both {taken_by[ckpt_key]!r} and "
                f"{model_key!r} of the model; load without matching_heuristics, or rename "
                "the checkpoint's keys to the model's."
            )
        taken_by[ckpt_key] = model_key
        result[model_key] = value
        if ckpt_key != model_key:
            logger.info("%s loaded from %s", model_key, ckpt_key)
    for ckpt_key in ckpt_keys:
        if ckpt_key not in taken_by and ckpt_key not in result:
            result[ckpt_key] = ckpt_state_dict[ckpt_key]
    return result


# detectron2's renaming of Caffe2 blobs: projects import these names, calling one says why not.
_C2_REASON = (
    "detectron2's renaming of Caffe2/Detectron .pkl weight names, which trainkit does not load"
)
_C2_ADVICE = "convert the weights to a .pth state dict of your model with detectron2 first"
convert_basic_c2_names = detection_only(
    "convert_basic_c2_names", __name__, "", _C2_ADVICE, reason=_C2_REASON
)
convert_c2_detectron_names = detection_only(
    "convert_c2_detectron_names", __name__, "", _C2_ADVICE, reason=_C2_REASON
)
