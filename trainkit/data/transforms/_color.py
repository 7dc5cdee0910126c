"""Random colour changes (exported by ``augmentation_impl``): blends that move no pixel."""

from __future__ import annotations

import numpy as np
from fvcore.transforms.transform import BlendTransform, Transform

from trainkit.data.mapping.record_mapper import augmentation_rng
from trainkit.data.transforms.augmentation import Augmentation

__all__ = ["RandomBrightness", "RandomContrast", "RandomLighting", "RandomSaturation"]

# ITU-R BT.601 luma weights of R, G, B.
_LUMA = np.array([0.299, 0.587, 0.114])


def _check_rgb(image: np.ndarray, name: str) -> None:
    if image.ndim != 3 or image.shape[-1] != 3:
        raise ValueError(f"{name} needs an HxWx3 RGB image, got shape {image.shape}")


class RandomContrast(Augmentation):
    """Blend with the image's mean: weight ``w`` drawn in ``[intensity_min, intensity_max]``.

    ``w < 1`` lowers the contrast, ``w > 1`` raises it, 1 keeps the image.
    """

    def __init__(self, intensity_min: float, intensity_max: float):
        """Args: the range of the weight."""
        super().__init__()
        self._init(locals())

    def get_transform(self, image: np.ndarray) -> Transform:
        w = augmentation_rng().uniform(self.intensity_min, self.intensity_max)
        return BlendTransform(src_image=image.mean(), src_weight=1 - w, dst_weight=w)


class RandomBrightness(Augmentation):
    """Scale the pixel values by ``w``, drawn in ``[intensity_min, intensity_max]``."""

    def __init__(self, intensity_min: float, intensity_max: float):
        """Args: the range of the factor."""
        super().__init__()
        self._init(locals())

    def get_transform(self, image: np.ndarray) -> Transform:
        w = augmentation_rng().uniform(self.intensity_min, self.intensity_max)
        return BlendTransform(src_image=0, src_weight=1 - w, dst_weight=w)


class RandomSaturation(Augmentation):
    """Blend an RGB image with its grey version: weight ``w`` drawn in the range.

    ``w < 1`` desaturates (0: grey), ``w > 1`` saturates more.
    """

    def __init__(self, intensity_min: float, intensity_max: float):
        """Args: the range of the weight."""
        super().__init__()
        self._init(locals())

    def get_transform(self, image: np.ndarray) -> Transform:
        _check_rgb(image, "RandomSaturation")
        w = augmentation_rng().uniform(self.intensity_min, self.intensity_max)
        grey = image.dot(_LUMA)[:, :, np.newaxis]
        return BlendTransform(src_image=grey, src_weight=1 - w, dst_weight=w)


class RandomLighting(Augmentation):
    """AlexNet's "lighting" noise: add a random mix of ImageNet's RGB principal components.

    The components' weights are normal with standard deviation ``scale``, times each
    component's eigenvalue. The image must be RGB.
    """

    def __init__(self, scale: float):
        """Args: the standard deviation of the weights."""
        super().__init__()
        self._init(locals())
        # The principal components of ImageNet's RGB pixels (published with AlexNet).
        self.eigen_vecs = np.array(
            [[-0.5675, 0.7192, 0.4009], [-0.5808, -0.0045, -0.8140], [-0.5836, -0.6948, 0.4203]]
        )
        self.eigen_vals = np.array([0.2175, 0.0188, 0.0045])

    def get_transform(self, image: np.ndarray) -> Transform:
        _check_rgb(image, "RandomLighting")
        weights = augmentation_rng().normal(scale=self.scale, size=3)
        offset = self.eigen_vecs.dot(weights * self.eigen_vals)
        return BlendTransform(src_image=offset, src_weight=1.0, dst_weight=1.0)
