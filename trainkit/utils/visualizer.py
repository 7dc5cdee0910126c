"""detectron2's ``Visualizer`` for images and semantic segmentation, drawn with numpy and PIL.

Masks are blended into the image with numpy and text is drawn with PIL (a dependency of
trainkit, imported when drawing), so no plotting library is needed. The detection drawings of
detectron2's visualizer (instances, boxes, keypoints, panoptic segments) are detection-only
and raise :class:`~trainkit.utils.detection_only.DetectionOnlyError`.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping, Sequence
from typing import Any, Union

import numpy as np
import torch

from trainkit.utils.detection_only import detection_only_method
from trainkit.utils.errors import UsageError
from trainkit.utils.file_io import PathManager

__all__ = ["ColorMode", "VisImage", "Visualizer"]

Color = Union[str, Sequence[float]]

_OFF_WHITE = (1.0, 1.0, 240.0 / 255)
# matplotlib's one-letter colour codes, which detectron2's callers pass (``color="g"``).
_SHORT_COLORS = {
    "b": (0.0, 0.0, 1.0),
    "g": (0.0, 0.5, 0.0),
    "r": (1.0, 0.0, 0.0),
    "c": (0.0, 0.75, 0.75),
    "m": (0.75, 0.0, 0.75),
    "y": (0.75, 0.75, 0.0),
    "k": (0.0, 0.0, 0.0),
    "w": (1.0, 1.0, 1.0),
}
_DEFAULT_IGNORE_LABEL = 255


class ColorMode(enum.Enum):
    """How instances are coloured in detectron2 (kept for its callers; trainkit draws none)."""

    IMAGE = 0
    SEGMENTATION = 1
    IMAGE_BW = 2


def to_rgb(color: Color) -> tuple[float, float, float]:
    """Return ``color`` (a name, ``"#rrggbb"``, a one-letter code, or RGB) as RGB in [0, 1].

    RGB values above 1 are read as 0-255 (as metadata's ``stuff_colors`` are).

    Raises:
        UsageError: If ``color`` is not a colour.
    """
    if isinstance(color, str):
        if color in _SHORT_COLORS:
            return _SHORT_COLORS[color]
        from PIL import ImageColor

        try:
            rgb = ImageColor.getrgb(color)
        except ValueError:
            raise UsageError(
                f"Unknown colour {color!r}; use a name ('green'), '#rrggbb' or an RGB tuple."
            ) from None
        return (rgb[0] / 255, rgb[1] / 255, rgb[2] / 255)
    values = [float(c) for c in color][:3]
    if len(values) != 3:
        raise UsageError(f"A colour needs 3 RGB values, got {color!r}.")
    scale = 255.0 if max(values) > 1 else 1.0
    return (values[0] / scale, values[1] / scale, values[2] / scale)


def _label_color(label: int) -> tuple[float, float, float]:
    # A fixed colour per label (golden-ratio hues): the same class looks the same in every
    # image, which a random colour per call would not give.
    import colorsys

    return colorsys.hsv_to_rgb((label * 0.618033988749895) % 1.0, 0.65, 0.95)


class VisImage:
    """The canvas a :class:`Visualizer` draws on: an RGB image, output at ``scale``."""

    def __init__(self, img: np.ndarray, scale: float = 1.0) -> None:
        """Wrap ``img`` (``H x W x 3`` RGB, uint8); ``scale`` resizes the output image."""
        self.img = img
        self.scale = scale
        self.height, self.width = img.shape[:2]
        self.canvas = img.astype(np.float32)

    def get_image(self) -> np.ndarray:
        """Return the drawing as an ``H*scale x W*scale x 3`` RGB uint8 array."""
        image = np.clip(np.rint(self.canvas), 0, 255).astype(np.uint8)
        if self.scale == 1.0:
            return image
        from PIL import Image

        size = (max(1, round(self.width * self.scale)), max(1, round(self.height * self.scale)))
        return np.asarray(Image.fromarray(image).resize(size, Image.BILINEAR))

    def save(self, filepath: str) -> None:
        """Write the drawing to ``filepath`` (format from the extension, e.g. ``.png``)."""
        from PIL import Image

        if directory := os.path.dirname(filepath):
            PathManager.mkdirs(directory)
        Image.fromarray(self.get_image()).save(filepath)


class Visualizer:
    """Draw semantic segmentations and text on an RGB image (detectron2's API).

    Supported: :meth:`draw_sem_seg`, :meth:`draw_binary_mask`, :meth:`draw_text`,
    :meth:`draw_dataset_dict` (images and ``sem_seg`` / ``sem_seg_file_name``) and
    :meth:`get_output`. The detection drawings raise ``DetectionOnlyError``.
    """

    def __init__(
        self,
        img_rgb: np.ndarray | torch.Tensor,
        metadata: Any = None,
        scale: float = 1.0,
        instance_mode: ColorMode = ColorMode.IMAGE,
    ) -> None:
        """Start drawing on ``img_rgb``.

        Args:
            img_rgb: ``H x W x 3`` RGB (or ``H x W`` grey) values in [0, 255].
            metadata: a dataset's ``Metadata`` (``stuff_classes``, ``stuff_colors``,
                ``ignore_label`` are read when present), or ``None``.
            scale: size of the output image relative to ``img_rgb``.
            instance_mode: detectron2's colouring of instances; unused (no instances).
        """
        img = np.asarray(img_rgb)
        if img.ndim == 2:
            img = np.repeat(img[:, :, None], 3, axis=2)
        if img.ndim != 3 or img.shape[2] not in (3, 4):  # RGB, or RGBA (alpha dropped)
            raise UsageError(
                f"Visualizer needs an H x W x 3 RGB image, got shape {tuple(img.shape)}; "
                "convert a CHW tensor with .permute(1, 2, 0) and a BGR image with [:, :, ::-1]."
            )
        self.img = np.clip(img[:, :, :3], 0, 255).astype(np.uint8)
        self.metadata = metadata
        self.output = VisImage(self.img, scale=scale)
        self._instance_mode = instance_mode
        self._default_font_size = max(np.sqrt(self.output.height * self.output.width) // 90, 10)

    def _meta(self, key: str, default: Any = None) -> Any:
        return default if self.metadata is None else getattr(self.metadata, key, default)

    def draw_sem_seg(
        self,
        sem_seg: np.ndarray | torch.Tensor,
        area_threshold: int | None = None,
        alpha: float = 0.8,
    ) -> VisImage:
        """Colour each class of a label map and write its name on it, largest first.

        Args:
            sem_seg: ``H x W`` class ids (argmax a model's ``(K, H, W)`` scores first).
            area_threshold: classes covering fewer pixels are not drawn.
            alpha: opacity of the colours.

        Returns:
            The canvas (:class:`VisImage`).
        """
        if isinstance(sem_seg, torch.Tensor):
            sem_seg = sem_seg.detach().cpu().numpy()
        sem_seg = np.asarray(sem_seg)
        labels, areas = np.unique(sem_seg, return_counts=True)
        classes = self._meta("stuff_classes")
        colors = self._meta("stuff_colors")
        ignore = self._meta("ignore_label", _DEFAULT_IGNORE_LABEL)
        for label in labels[np.argsort(-areas, kind="stable")]:
            label = int(label)
            if label == ignore or label < 0 or (classes is not None and label >= len(classes)):
                continue
            color = to_rgb(colors[label]) if colors is not None else _label_color(label)
            text = str(classes[label]) if classes is not None else str(label)
            self.draw_binary_mask(
                sem_seg == label,
                color=color,
                edge_color=_OFF_WHITE,
                text=text,
                alpha=alpha,
                area_threshold=area_threshold,
            )
        return self.output

    def draw_binary_mask(
        self,
        binary_mask: np.ndarray,
        color: Color | None = None,
        *,
        edge_color: Color | None = None,
        text: str | None = None,
        alpha: float = 0.5,
        area_threshold: int | None = 10,
    ) -> VisImage:
        """Blend ``color`` into the pixels of ``binary_mask``, outline it, and label it.

        Args:
            binary_mask: ``H x W``, non-zero where the mask is.
            color: the fill colour (a fixed colour if ``None``).
            edge_color: the outline's colour (no outline if ``None``).
            text: written at the mask's centre, if given.
            alpha: opacity of the fill.
            area_threshold: masks of fewer pixels are not drawn (``None``: all).

        Returns:
            The canvas (:class:`VisImage`).
        """
        mask = np.asarray(binary_mask).astype(bool)
        area = int(mask.sum())
        if area == 0 or (area_threshold is not None and area < area_threshold):
            return self.output
        fill = np.asarray(to_rgb(color) if color is not None else _label_color(0)) * 255
        canvas = self.output.canvas
        canvas[mask] = (1 - alpha) * canvas[mask] + alpha * fill
        if edge_color is not None:
            canvas[mask & ~_eroded(mask)] = np.asarray(to_rgb(edge_color)) * 255
        if text is not None:
            ys, xs = np.nonzero(mask)
            # The mask pixel nearest the centroid: on the mask even when it is not convex.
            nearest = np.argmin((ys - ys.mean()) ** 2 + (xs - xs.mean()) ** 2)
            self.draw_text(text, (float(xs[nearest]), float(ys[nearest])), color=_OFF_WHITE)
        return self.output

    def draw_text(
        self,
        text: str,
        position: tuple[float, float],
        *,
        font_size: float | None = None,
        color: Color = "g",
        horizontal_alignment: str = "center",
        rotation: float = 0,
    ) -> VisImage:
        """Write ``text`` at ``position`` = (x, y) on a dark box, centred on y.

        Args:
            text: the text.
            position: the anchor, in image pixels.
            font_size: in pixels (default: grows with the image).
            color: the text colour.
            horizontal_alignment: ``"center"``, ``"left"`` or ``"right"`` of the anchor.
            rotation: ignored (detectron2's argument; text is drawn horizontally).

        Returns:
            The canvas (:class:`VisImage`).
        """
        from PIL import Image, ImageDraw, ImageFont

        if horizontal_alignment not in ("center", "left", "right"):
            raise UsageError(
                f"horizontal_alignment={horizontal_alignment!r}; use 'center', 'left' or 'right'."
            )
        size = int(font_size or self._default_font_size)
        try:
            font = ImageFont.load_default(size=size)
        except TypeError:  # Pillow < 10.1: one bitmap size
            font = ImageFont.load_default()
        layer = Image.fromarray(np.clip(self.output.canvas, 0, 255).astype(np.uint8))
        draw = ImageDraw.Draw(layer)
        left, top, right, bottom = draw.textbbox((0, 0), text, font=font)
        x, y = position
        x -= {"center": (right - left) / 2, "left": 0, "right": right - left}[horizontal_alignment]
        y -= (bottom - top) / 2 + top
        draw.rectangle((x + left - 2, y + top - 2, x + right + 2, y + bottom + 2), fill=(0, 0, 0))
        rgb = np.maximum(np.asarray(to_rgb(color)), 0.2)  # keep dark colours readable on black
        draw.text((x, y), text, font=font, fill=tuple(int(c * 255) for c in rgb))
        self.output.canvas = np.asarray(layer, dtype=np.float32).copy()
        return self.output

    def draw_dataset_dict(self, dic: Mapping[str, Any]) -> VisImage:
        """Draw a dataset record's semantic segmentation (``sem_seg`` or ``sem_seg_file_name``).

        Raises:
            DetectionOnlyError: If the record has instance ``annotations`` or a panoptic
                segmentation to draw.
        """
        if dic.get("annotations"):
            self.overlay_instances()
        if "pan_seg" in dic or "pan_seg_file_name" in dic:
            self.draw_panoptic_seg(None, None)
        sem_seg = dic.get("sem_seg")
        if sem_seg is None and "sem_seg_file_name" in dic:
            from PIL import Image

            with PathManager.open(dic["sem_seg_file_name"], "rb") as f:
                sem_seg = np.asarray(Image.open(f), dtype=np.int64)
        if sem_seg is not None:
            self.draw_sem_seg(sem_seg, area_threshold=0, alpha=0.5)
        return self.output

    def get_output(self) -> VisImage:
        """Return the canvas drawn so far (``get_image()``, ``save(path)``)."""
        return self.output

    _OWNER = "utils.visualizer.Visualizer"
    draw_instance_predictions = detection_only_method(
        "draw_instance_predictions", "drawing predicted instances", _OWNER
    )
    draw_panoptic_seg = detection_only_method(
        "draw_panoptic_seg", "drawing a panoptic segmentation", _OWNER
    )
    overlay_instances = detection_only_method(
        "overlay_instances", "drawing instance boxes, masks and keypoints", _OWNER
    )
    overlay_rotated_instances = detection_only_method(
        "overlay_rotated_instances", "drawing rotated boxes", _OWNER
    )
    draw_and_connect_keypoints = detection_only_method(
        "draw_and_connect_keypoints", "drawing keypoints", _OWNER
    )
    draw_box = detection_only_method("draw_box", "drawing a box", _OWNER)
    draw_rotated_box_with_label = detection_only_method(
        "draw_rotated_box_with_label", "drawing a rotated box", _OWNER
    )


def _eroded(mask: np.ndarray) -> np.ndarray:
    """Return ``mask`` shrunk by one pixel (a pixel stays if its 4 neighbours are set).

    The image's border is not an outline: pixels outside it repeat the edge.
    """
    p = np.pad(mask, 1, mode="edge")
    return p[1:-1, 1:-1] & p[:-2, 1:-1] & p[2:, 1:-1] & p[1:-1, :-2] & p[1:-1, 2:]
