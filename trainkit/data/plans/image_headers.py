"""Image sizes read from file headers, as a decoded image would have them (EXIF orientation).

Aspect-ratio grouping of records without ``width``/``height`` (every record of
``load_sem_seg``) needs each image's size before the image is loaded; PIL's ``Image.open``
parses the header only, so reading a size costs a file open and a few hundred bytes.
"""

from __future__ import annotations

import logging

from trainkit.utils.file_io import PathManager

logger = logging.getLogger(__name__)

__all__ = ["image_size_from_header"]

_EXIF_ORIENTATION = 0x0112
# EXIF orientations 5-8 turn the image by 90 degrees (transposed or not) when it is read
# upright, so its width and height swap; 1-4 only mirror or turn it by 180 degrees.
_QUARTER_TURNS = frozenset({5, 6, 7, 8})


def image_size_from_header(file_name: str) -> tuple[int, int]:
    """Return ``(width, height)`` of the image in ``file_name`` after its EXIF orientation.

    Only the header is read, not the pixels. The size is the one a reader that turns images
    upright by their EXIF orientation (detectron2's ``read_image``) returns.

    Raises:
        OSError: If the file cannot be opened or is not an image PIL can identify
            (``PIL.UnidentifiedImageError`` is an ``OSError``).
    """
    from PIL import Image  # imported here: `import trainkit.data` does not load PIL

    with PathManager.open(file_name, "rb") as f, Image.open(f) as image:
        width, height = image.size
        orientation = _exif_orientation(image, file_name)
    return (height, width) if orientation in _QUARTER_TURNS else (width, height)


def _exif_orientation(image: object, file_name: str) -> int | None:
    """The EXIF orientation tag of an opened image, or None; never decodes the pixels."""
    info = getattr(image, "info", {})
    # Pillow's PNG getexif() decodes the whole image to look for an eXIf chunk after the
    # pixels; one before them is already in `info`, and cameras put EXIF in JPEGs anyway.
    if getattr(image, "format", None) == "PNG" and "exif" not in info:
        return None
    try:
        return image.getexif().get(_EXIF_ORIENTATION)  # type: ignore[attr-defined]
    except Exception:  # a malformed EXIF block: the image is read as stored, as read_image does
        logger.debug("Unreadable EXIF in %s; using the stored orientation", file_name)
        return None
