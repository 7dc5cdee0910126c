"""detectron2's config versions: ``upgrade_config``, ``downgrade_config``, ``guess_version``.

detectron2 renamed some keys before its release (VERSION 0 -> 1 -> 2, its current one, which
trainkit's defaults have too). A YAML file of an older version still loads:
``CfgNode.merge_from_file`` renames its keys to today's (:func:`upgrade_partial`). The
renamed keys are detectron2's (mostly detection keys, all present in trainkit's defaults);
``upgrade_config`` / ``downgrade_config`` convert whole configs, as in detectron2.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # yacs's node, which trainkit's CfgNode extends (importing that one would be circular).
    from fvcore.common.config import CfgNode

__all__ = ["downgrade_config", "guess_version", "upgrade_config"]

logger = logging.getLogger(__name__)

LATEST_VERSION = 2
"""detectron2's (and trainkit's) current ``VERSION``; ``defaults._C.VERSION`` equals it."""

# (old name, new name) of each version's renames, applied in order when upgrading to it.
_RENAMES: dict[int, list[tuple[str, str]]] = {
    1: [("MODEL.RPN_HEAD.NAME", "MODEL.RPN.HEAD_NAME")],
    2: [
        ("MODEL.WEIGHT", "MODEL.WEIGHTS"),
        ("MODEL.PANOPTIC_FPN.SEMANTIC_LOSS_SCALE", "MODEL.SEM_SEG_HEAD.LOSS_WEIGHT"),
        ("MODEL.PANOPTIC_FPN.RPN_LOSS_SCALE", "MODEL.RPN.LOSS_WEIGHT"),
        ("MODEL.PANOPTIC_FPN.INSTANCE_LOSS_SCALE", "MODEL.PANOPTIC_FPN.INSTANCE_LOSS_WEIGHT"),
        ("MODEL.PANOPTIC_FPN.COMBINE_ON", "MODEL.PANOPTIC_FPN.COMBINE.ENABLED"),
        (
            "MODEL.PANOPTIC_FPN.COMBINE_OVERLAP_THRESHOLD",
            "MODEL.PANOPTIC_FPN.COMBINE.OVERLAP_THRESH",
        ),
        (
            "MODEL.PANOPTIC_FPN.COMBINE_STUFF_AREA_LIMIT",
            "MODEL.PANOPTIC_FPN.COMBINE.STUFF_AREA_LIMIT",
        ),
        (
            "MODEL.PANOPTIC_FPN.COMBINE_INSTANCES_CONFIDENCE_THRESHOLD",
            "MODEL.PANOPTIC_FPN.COMBINE.INSTANCES_CONFIDENCE_THRESH",
        ),
        ("MODEL.ROI_HEADS.SCORE_THRESH", "MODEL.ROI_HEADS.SCORE_THRESH_TEST"),
        ("MODEL.ROI_HEADS.NMS", "MODEL.ROI_HEADS.NMS_THRESH_TEST"),
        ("MODEL.RETINANET.INFERENCE_SCORE_THRESHOLD", "MODEL.RETINANET.SCORE_THRESH_TEST"),
        ("MODEL.RETINANET.INFERENCE_TOPK_CANDIDATES", "MODEL.RETINANET.TOPK_CANDIDATES_TEST"),
        ("MODEL.RETINANET.INFERENCE_NMS_THRESHOLD", "MODEL.RETINANET.NMS_THRESH_TEST"),
        ("TEST.DETECTIONS_PER_IMG", "TEST.DETECTIONS_PER_IMAGE"),
        ("TEST.AUG_ON", "TEST.AUG.ENABLED"),
        ("TEST.AUG_MIN_SIZES", "TEST.AUG.MIN_SIZES"),
        ("TEST.AUG_MAX_SIZE", "TEST.AUG.MAX_SIZE"),
        ("TEST.AUG_FLIP", "TEST.AUG.FLIP"),
    ],
}
# Version 2 also moved the anchors of RPN (or of RetinaNet) to MODEL.ANCHOR_GENERATOR.
_ANCHOR_KEYS = (("ANCHOR_SIZES", "SIZES"), ("ANCHOR_ASPECT_RATIOS", "ASPECT_RATIOS"))


def _has(cfg: MutableMapping[str, Any], name: str) -> bool:
    node: Any = cfg
    for part in name.split("."):
        if not isinstance(node, MutableMapping) or part not in node:
            return False
        node = node[part]
    return True


def _pop(cfg: MutableMapping[str, Any], name: str) -> Any:
    """Remove ``name`` and return its value; a group left empty is removed too."""
    *parents, last = name.split(".")
    nodes = [cfg]
    for part in parents:
        nodes.append(nodes[-1][part])
    value = nodes[-1].pop(last)
    for depth in range(len(parents), 0, -1):
        if len(nodes[depth]) == 0:
            del nodes[depth - 1][parents[depth - 1]]
    return value


def _put(cfg: MutableMapping[str, Any], name: str, value: Any) -> None:
    *parents, last = name.split(".")
    node = cfg
    for part in parents:
        if part not in node:
            node[part] = type(cfg)()  # a node of the config's own class
        node = node[part]
    node[last] = value


def _rename(cfg: MutableMapping[str, Any], old: str, new: str) -> None:
    if _has(cfg, old):
        _put(cfg, new, _pop(cfg, old))


def _upgrade_to(cfg: MutableMapping[str, Any], version: int, *, partial: bool) -> None:
    for old, new in _RENAMES[version]:
        _rename(cfg, old, new)
    if version != 2:
        return
    model = cfg.get("MODEL", {})
    owner = "RETINANET" if model.get("META_ARCHITECTURE") == "RetinaNet" else "RPN"
    other = "RPN" if owner == "RETINANET" else "RETINANET"
    for old, new in _ANCHOR_KEYS:
        _rename(cfg, f"MODEL.{owner}.{old}", f"MODEL.ANCHOR_GENERATOR.{new}")
        if not partial and _has(cfg, f"MODEL.{other}.{old}"):
            _pop(cfg, f"MODEL.{other}.{old}")
    if not partial and _has(cfg, "MODEL.RETINANET.ANCHOR_STRIDES"):
        _pop(cfg, "MODEL.RETINANET.ANCHOR_STRIDES")


def _downgrade_from(cfg: MutableMapping[str, Any], version: int) -> None:
    for old, new in reversed(_RENAMES[version]):
        _rename(cfg, new, old)
    if version != 2:
        return
    for old, new in _ANCHOR_KEYS:
        _rename(cfg, f"MODEL.ANCHOR_GENERATOR.{new}", f"MODEL.RPN.{old}")
        if _has(cfg, f"MODEL.RPN.{old}"):
            _put(cfg, f"MODEL.RETINANET.{old}", cfg["MODEL"]["RPN"][old])
    _put(cfg, "MODEL.RETINANET.ANCHOR_STRIDES", [])  # read by no version


def upgrade_config(cfg: CfgNode, to_version: int | None = None) -> CfgNode:
    """Return a copy of the whole config ``cfg`` converted to ``to_version`` (default: latest).

    Raises:
        ValueError: If ``cfg.VERSION`` is newer than ``to_version``.
    """
    to_version = LATEST_VERSION if to_version is None else to_version
    if cfg.VERSION > to_version:
        raise ValueError(f"cannot upgrade a config from VERSION {cfg.VERSION} to {to_version}")
    cfg = cfg.clone()
    for version in range(cfg.VERSION + 1, to_version + 1):
        _upgrade_to(cfg, version, partial=False)
        cfg.VERSION = version
    return cfg


def downgrade_config(cfg: CfgNode, to_version: int) -> CfgNode:
    """Return a copy of the whole config ``cfg`` with the keys of ``to_version``.

    As in detectron2, this is meant to recover an old version's defaults (so that a
    partial file of that version can be merged and upgraded), not to convert any config.

    Raises:
        ValueError: If ``cfg.VERSION`` is older than ``to_version``.
    """
    if cfg.VERSION < to_version:
        raise ValueError(f"cannot downgrade a config from VERSION {cfg.VERSION} to {to_version}")
    cfg = cfg.clone()
    for version in range(cfg.VERSION, to_version, -1):
        _downgrade_from(cfg, version)
        cfg.VERSION = version - 1
    return cfg


def guess_version(cfg: MutableMapping[str, Any], filename: str) -> int:
    """Return the version of a partial config without ``VERSION``: 1 if it has a key only
    version 1 has (``MODEL.WEIGHT``, ``TEST.AUG_ON``), else the latest."""
    if _has(cfg, "MODEL.WEIGHT") or _has(cfg, "TEST.AUG_ON"):
        logger.warning("Config '%s' has no VERSION; its keys say VERSION 1.", filename)
        return 1
    return LATEST_VERSION


def upgrade_partial(loaded: MutableMapping[str, Any], filename: str) -> None:
    """Rename, in place, the keys of a loaded config file of an older VERSION to today's.

    The ``VERSION`` of such a file is removed from ``loaded``: the merged config keeps the
    latest one. A file of the latest version (or without one) is left as it is.
    """
    version = loaded.get("VERSION")
    if version is None:
        version = guess_version(loaded, filename)
    if not isinstance(version, int) or version >= LATEST_VERSION:
        return
    loaded.pop("VERSION", None)
    logger.info("Renaming the keys of %s from VERSION %d to %d", filename, version, LATEST_VERSION)
    for target in range(max(version, 0) + 1, LATEST_VERSION + 1):
        _upgrade_to(loaded, target, partial=True)
