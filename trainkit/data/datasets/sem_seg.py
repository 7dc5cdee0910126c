"""``load_sem_seg``: records of a semantic-segmentation dataset from two folders of files."""

from __future__ import annotations

import logging
import os
from typing import Any

from trainkit.utils.errors import UsageError
from trainkit.utils.file_io import PathManager

logger = logging.getLogger(__name__)

__all__ = ["load_sem_seg"]


def _files_by_name(root: str, ext: str) -> dict[str, str]:
    """``{name without the extension: path}`` of the files of ``root`` ending in ``ext``."""
    if not PathManager.isdir(root):
        raise UsageError(f"load_sem_seg: {root!r} is not a directory; check the dataset's path")
    suffix = ext if ext.startswith(".") else "." + ext
    return {
        name[: -len(suffix)]: os.path.join(root, name)
        for name in PathManager.ls(root)
        if name.endswith(suffix)
    }


def load_sem_seg(
    gt_root: str, image_root: str, gt_ext: str = "png", image_ext: str = "jpg"
) -> list[dict[str, Any]]:
    """Pair the images of ``image_root`` with the label maps of ``gt_root`` by file name.

    ``image_root/a.jpg`` goes with ``gt_root/a.png``. A file without a partner is left out
    (with a warning giving the counts). The records hold ``file_name`` and
    ``sem_seg_file_name``, sorted by name, and no ``width``/``height`` (the image is not
    opened here). Register it as ``DatasetCatalog.register(name, lambda: load_sem_seg(...))``.

    Args:
        gt_root: folder of label maps (one integer label per pixel).
        image_root: folder of images.
        gt_ext, image_ext: the files' extensions (with or without the dot).

    Returns:
        One dict per pair.

    Raises:
        UsageError: If a folder does not exist or no image has a label map.
    """
    images = _files_by_name(image_root, image_ext)
    labels = _files_by_name(gt_root, gt_ext)
    names = sorted(images.keys() & labels.keys())
    if len(names) != len(images) or len(names) != len(labels):
        logger.warning(
            "%s has %d images and %s %d label maps; using the %d names found in both",
            *(image_root, len(images), gt_root, len(labels), len(names)),
        )
    if not names:
        raise UsageError(
            f"load_sem_seg found no image in {image_root!r} (*.{image_ext.lstrip('.')}) with a "
            f"label map of the same name in {gt_root!r} (*.{gt_ext.lstrip('.')}); check the "
            "folders and extensions"
        )
    logger.info("Loaded %d images with semantic segmentation from %s", len(names), image_root)
    return [{"file_name": images[n], "sem_seg_file_name": labels[n]} for n in names]
