"""Deterministic transforms: fvcore's, plus the resize, rotation, extent and colour ones.

fvcore's ``Transform`` is the base (``apply_image`` / ``apply_coords`` / ``apply_box`` /
``apply_segmentation`` / ``inverse``); its transforms are re-exported here under the names
detectron2 uses. Images are ``HxW`` or ``HxWxC`` arrays, ``uint8`` (0-255) or floating
point; coordinates are ``Nx2`` arrays of continuous ``(x, y)`` (pixel ``i`` spans
``[i, i + 1)``), boxes ``Nx4`` XYXY in absolute pixels. Resampling uses PIL (OpenCV is not a
dependency): ``interp`` arguments take PIL filters (``Image.Resampling.BILINEAR``, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from fvcore.transforms.transform import (
    BlendTransform,
    CropTransform,
    GridSampleTransform,
    HFlipTransform,
    NoOpTransform,
    PadTransform,
    ScaleTransform,
    Transform,
    TransformList,
    VFlipTransform,
)

__all__ = [
    "BlendTransform",
    "ColorTransform",
    "CropTransform",
    "ExtentTransform",
    "GridSampleTransform",
    "HFlipTransform",
    "NoOpTransform",
    "PILColorTransform",
    "PadTransform",
    "ResizeTransform",
    "RotationTransform",
    "ScaleTransform",
    "Transform",
    "TransformList",
    "VFlipTransform",
]

# PIL's filter numbers (Image.Resampling), so that importing this module does not load PIL.
_NEAREST = 0
_BILINEAR = 2
# uint8 layouts PIL holds as one image; anything else goes through PIL a channel at a time.
_UINT8_MODES = {1: "L", 3: "RGB", 4: "RGBA"}


def _through_pil(img: np.ndarray, op: Callable[[Any], Any]) -> np.ndarray:
    """Apply a PIL geometric ``op`` to an ``HxW`` / ``HxWxC`` array of any dtype.

    uint8 images with 1, 3 or 4 channels are one PIL image; other arrays are resampled one
    channel at a time ("L" for uint8, "F" (float32) otherwise) and keep their dtype.
    """
    from PIL import Image

    if img.ndim not in (2, 3):
        raise ValueError(f"expected an HxW or HxWxC image, got an array of shape {img.shape}")
    channels = 1 if img.ndim == 2 else img.shape[2]
    if img.dtype == np.uint8 and channels in _UINT8_MODES:
        plane = img if img.ndim == 2 else (img[:, :, 0] if channels == 1 else img)
        out = np.asarray(op(Image.fromarray(np.ascontiguousarray(plane))))
        return out[:, :, None] if img.ndim == 3 and channels == 1 else out
    planes = img[:, :, None] if img.ndim == 2 else img
    results = []
    for c in range(channels):
        plane = planes[:, :, c]
        if plane.dtype == np.uint8:
            results.append(np.asarray(op(Image.fromarray(np.ascontiguousarray(plane)))))
        else:
            as_float = np.ascontiguousarray(plane, dtype=np.float32)
            results.append(np.asarray(op(Image.fromarray(as_float))))  # mode "F"
    out = np.stack(results, axis=-1).astype(img.dtype, copy=False)
    return out[:, :, 0] if img.ndim == 2 else out


class ResizeTransform(Transform):
    """Resize an ``h x w`` image to ``new_h x new_w`` (coordinates scale with it)."""

    def __init__(self, h: int, w: int, new_h: int, new_w: int, interp: int | None = None):
        """Args: original and new size in pixels; ``interp`` a PIL filter (default bilinear)."""
        super().__init__()
        if interp is None:
            interp = _BILINEAR
        self._set_attributes(locals())

    def apply_image(self, img: np.ndarray, interp: int | None = None) -> np.ndarray:
        """Resample ``img`` (``HxW`` / ``HxWxC``, any dtype) to the new size."""
        if img.shape[:2] != (self.h, self.w):
            raise ValueError(
                f"ResizeTransform expects an image of {self.h}x{self.w}, got {img.shape[:2]}"
            )
        size, method = (self.new_w, self.new_h), self.interp if interp is None else interp
        return _through_pil(img, lambda im: im.resize(size, method))

    def apply_coords(self, coords: np.ndarray) -> np.ndarray:
        """Scale ``x`` by ``new_w / w`` and ``y`` by ``new_h / h``."""
        coords[:, 0] = coords[:, 0] * (self.new_w / self.w)
        coords[:, 1] = coords[:, 1] * (self.new_h / self.h)
        return coords

    def apply_segmentation(self, segmentation: np.ndarray) -> np.ndarray:
        """Resize a label map with nearest-neighbour sampling (labels are not blended)."""
        return self.apply_image(segmentation, interp=_NEAREST)

    def inverse(self) -> Transform:
        """The resize back to ``h x w``."""
        return ResizeTransform(self.new_h, self.new_w, self.h, self.w, self.interp)


class RotationTransform(Transform):
    """Rotate counter-clockwise by ``angle`` degrees about ``center`` (default: the middle).

    With ``expand`` the output is large enough for the whole rotated image (the centre then
    only shifts it); otherwise it keeps ``h x w`` and corners are cut. Uncovered pixels are 0.
    """

    def __init__(
        self,
        h: int,
        w: int,
        angle: float,
        expand: bool = True,
        center: tuple[float, float] | None = None,
        interp: int | None = None,
    ):
        """Args: input size; angle in degrees; center ``(x, y)`` in pixels; a PIL filter."""
        super().__init__()
        image_center = np.array((w / 2, h / 2))
        if center is None:
            center = image_center
        if interp is None:
            interp = _BILINEAR
        cos, sin = np.cos(np.deg2rad(angle)), np.sin(np.deg2rad(angle))
        if expand:
            bound_w, bound_h = np.rint([h * abs(sin) + w * abs(cos), h * abs(cos) + w * abs(sin)])
            bound_w, bound_h = int(bound_w), int(bound_h)
        else:
            bound_w, bound_h = w, h
        self._set_attributes(locals())
        self.rm_coords = self.create_rotation_matrix()

    def create_rotation_matrix(self) -> np.ndarray:
        """The 2x3 matrix taking input ``(x, y, 1)`` to output coordinates."""
        cos, sin = self.cos, self.sin
        cx, cy = float(self.center[0]), float(self.center[1])
        # y points down, so a counter-clockwise turn on screen is this matrix about (cx, cy).
        matrix = np.array(
            [[cos, sin, (1 - cos) * cx - sin * cy], [-sin, cos, sin * cx + (1 - cos) * cy]]
        )
        if self.expand:
            # Move the image centre to the centre of the enlarged output.
            moved = matrix @ np.array([*self.image_center, 1.0])
            matrix[:, 2] += np.array([self.bound_w / 2, self.bound_h / 2]) - moved
        return matrix

    def apply_image(self, img: np.ndarray, interp: int | None = None) -> np.ndarray:
        """Rotate ``img`` (``HxW`` / ``HxWxC``, any dtype)."""
        if img.size == 0 or self.angle % 360 == 0:
            return img
        if img.shape[:2] != (self.h, self.w):
            raise ValueError(
                f"RotationTransform expects an image of {self.h}x{self.w}, got {img.shape[:2]}"
            )
        from PIL import Image

        # PIL wants the output -> input map, in the same continuous coordinates.
        full = np.vstack([self.rm_coords, [0.0, 0.0, 1.0]])
        inverse = np.linalg.inv(full)[:2].ravel().tolist()
        size, method = (self.bound_w, self.bound_h), self.interp if interp is None else interp
        return _through_pil(
            img, lambda im: im.transform(size, Image.Transform.AFFINE, inverse, resample=method)
        )

    def apply_coords(self, coords: np.ndarray) -> np.ndarray:
        """Rotate ``Nx2`` points."""
        coords = np.asarray(coords, dtype=float)
        if len(coords) == 0 or self.angle % 360 == 0:
            return coords
        return coords @ self.rm_coords[:, :2].T + self.rm_coords[:, 2]

    def apply_segmentation(self, segmentation: np.ndarray) -> np.ndarray:
        """Rotate a label map with nearest-neighbour sampling."""
        return self.apply_image(segmentation, interp=_NEAREST)

    def inverse(self) -> Transform:
        """Rotate back (expanded) and crop the original size; only for ``expand=True``."""
        if not self.expand:
            raise NotImplementedError("a rotation without expand lost its corners: no inverse")
        back = RotationTransform(self.bound_h, self.bound_w, -self.angle, True, None, self.interp)
        crop = CropTransform(
            (back.bound_w - self.w) // 2, (back.bound_h - self.h) // 2, self.w, self.h
        )
        return TransformList([back, crop])


class ExtentTransform(Transform):
    """Take the rectangle ``src_rect`` of the image and scale it to ``output_size``.

    Parts of the rectangle outside the image are filled with ``fill``.
    """

    def __init__(
        self,
        src_rect: tuple[float, float, float, float],
        output_size: tuple[int, int],
        interp: int = _BILINEAR,
        fill: float = 0,
    ):
        """Args: ``src_rect`` ``(x0, y0, x1, y1)`` in input pixels; ``output_size`` ``(h, w)``."""
        super().__init__()
        self._set_attributes(locals())

    def apply_image(self, img: np.ndarray, interp: int | None = None) -> np.ndarray:
        """Crop-and-scale ``img`` (``HxW`` / ``HxWxC``, any dtype)."""
        from PIL import Image

        h, w = self.output_size
        rect = tuple(float(v) for v in self.src_rect)
        method = self.interp if interp is None else interp
        return _through_pil(
            img,
            lambda im: im.transform(
                (w, h), Image.Transform.EXTENT, rect, resample=method, fillcolor=self.fill
            ),
        )

    def apply_coords(self, coords: np.ndarray) -> np.ndarray:
        """Map points of the input to the output: shift to the rectangle, then scale."""
        h, w = self.output_size
        x0, y0, x1, y1 = self.src_rect
        out = coords.astype(np.float32)
        out[:, 0] = (out[:, 0] - x0) * (w / (x1 - x0))
        out[:, 1] = (out[:, 1] - y0) * (h / (y1 - y0))
        return out

    def apply_segmentation(self, segmentation: np.ndarray) -> np.ndarray:
        """Crop-and-scale a label map with nearest-neighbour sampling."""
        return self.apply_image(segmentation, interp=_NEAREST)


class ColorTransform(Transform):
    """Apply ``op`` (array -> array) to the image; geometry and label maps are unchanged."""

    def __init__(self, op: Callable[[np.ndarray], np.ndarray]):
        """Args: ``op``: a callable taking and returning an image array.

        Raises:
            ValueError: If ``op`` is not callable.
        """
        if not callable(op):
            raise ValueError(f"ColorTransform needs a callable op, got {type(op).__name__}")
        super().__init__()
        self._set_attributes(locals())

    def apply_image(self, img: np.ndarray) -> Any:
        """Return ``op(img)``."""
        return self.op(img)

    def apply_coords(self, coords: np.ndarray) -> np.ndarray:
        """Points do not move."""
        return coords

    def apply_segmentation(self, segmentation: np.ndarray) -> np.ndarray:
        """Label maps are unchanged."""
        return segmentation

    def inverse(self) -> Transform:
        """No geometric change to undo."""
        return NoOpTransform()


class PILColorTransform(ColorTransform):
    """Like :class:`ColorTransform`, with ``op`` taking and returning a PIL image.

    E.g. ``PILColorTransform(lambda im: ImageEnhance.Contrast(im).enhance(1.5))``; the
    image must be one PIL can hold (uint8 ``HxW`` or ``HxWx3/4``).
    """

    def __init__(self, op: Callable[[Any], Any]):
        """Args: ``op``: a callable taking and returning a PIL image."""
        super().__init__(op)

    def apply_image(self, img: np.ndarray) -> np.ndarray:
        """Return ``op`` applied to ``img`` as a PIL image, as an array."""
        from PIL import Image

        return np.asarray(self.op(Image.fromarray(img)))


# ---- rotated boxes ----------------------------------------------------------------------
# ``transform.apply_rotated_box(boxes)`` for ``Nx5`` arrays of (x_center, y_center, width,
# height, angle in degrees, counter-clockwise), registered on fvcore's types as detectron2
# does, with detectron2's formulas (so that its rotated-box code gets the same numbers).


def _hflip_rotated_box(transform: HFlipTransform, boxes: np.ndarray) -> np.ndarray:
    boxes[:, 0] = transform.width - boxes[:, 0]
    boxes[:, 4] = -boxes[:, 4]
    return boxes


def _resize_rotated_box(transform: ResizeTransform, boxes: np.ndarray) -> np.ndarray:
    sx, sy = transform.new_w / transform.w, transform.new_h / transform.h
    theta = np.deg2rad(boxes[:, 4])
    cos, sin = np.cos(theta), np.sin(theta)
    boxes[:, 0] *= sx
    boxes[:, 1] *= sy
    boxes[:, 2] *= np.hypot(sx * cos, sy * sin)
    boxes[:, 3] *= np.hypot(sx * sin, sy * cos)
    boxes[:, 4] = np.rad2deg(np.arctan2(sx * sin, sy * cos))
    return boxes


HFlipTransform.register_type("rotated_box", _hflip_rotated_box)
ResizeTransform.register_type("rotated_box", _resize_rotated_box)
NoOpTransform.register_type("rotated_box", lambda transform, boxes: boxes)
