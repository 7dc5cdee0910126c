"""Augmentations: policies that choose a :class:`Transform` for an input, and their inputs.

An :class:`Augmentation` looks at the fields of an input it names (``image``, ``boxes``,
``sem_seg``, ...) and returns the deterministic transform to apply; :class:`AugInput` holds
those fields and applies a transform to all of them, so that an image and its label map
move together. :class:`AugmentationList` runs several in turn (a plain ``Transform`` in the
list is applied as it is) and returns what it applied as one ``TransformList``, which the
caller then applies to anything else it has (points, its own annotations).

Random choices come from :meth:`Augmentation._rand_range` and
:func:`trainkit.data.mapping.record_mapper.augmentation_rng`: keyed by the sample's global stream
position inside a trainkit loader (the same for any ``NUM_WORKERS`` and after a resume),
seeded from ``np.random`` elsewhere.
"""

from __future__ import annotations

import inspect
import pprint
from collections.abc import Sequence
from typing import Any

import numpy as np
from fvcore.transforms.transform import Transform, TransformList

from trainkit.data.mapping.record_mapper import augmentation_rng

__all__ = [
    "AugInput",
    "Augmentation",
    "AugmentationList",
    "StandardAugInput",
    "TransformGen",
    "apply_augmentations",
    "apply_transform_gens",
]


def _check_image(image: Any) -> None:
    """Raise unless ``image`` is an ``HxW`` / ``HxWxC`` uint8 or floating-point array."""
    if not isinstance(image, np.ndarray):
        raise TypeError(
            f"augmentations need the image as a numpy array, got {type(image).__name__}; "
            "convert it with np.asarray(image)"
        )
    if image.dtype.kind in "iu" and image.dtype != np.uint8:  # kind: np.issubdtype, cheaper
        raise TypeError(
            f"augmentations take uint8 or floating-point images, got {image.dtype}; "
            "convert with image.astype(np.uint8) or image.astype(np.float32)"
        )
    if image.ndim not in (2, 3):
        raise ValueError(f"augmentations take HxW or HxWxC images, got shape {image.shape}")


def _input_args(aug: Augmentation) -> tuple[str, ...]:
    """The fields of the input that ``aug.get_transform`` takes (by its parameter names)."""
    if aug.input_args is None:
        params = list(inspect.signature(aug.get_transform).parameters.values())
        if len(params) == 1:
            # One parameter is the image, whatever it is called (detectron2's convention).
            names: tuple[str, ...] = ("image",)
        else:
            variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
            if any(p.kind in variadic for p in params):
                raise TypeError(
                    f"{type(aug).__name__}.get_transform takes *args/**kwargs, so the fields "
                    "it needs are unknown; set input_args or override __call__"
                )
            names = tuple(p.name for p in params)
        aug.input_args = names
    return aug.input_args


class Augmentation:
    """A policy that returns a :class:`Transform` chosen for (and maybe at random from) inputs.

    Subclasses implement ``get_transform(self, image, ...)``: its parameter names are the
    fields of the input it reads (one parameter is always ``image``), unless
    :attr:`input_args` names them. Conventions of the fields: ``image`` ``HxW`` or
    ``HxWxC``, uint8 (0-255) or float; ``boxes`` ``Nx4`` float XYXY in pixels; ``sem_seg``
    ``HxW`` integer labels. Draw random numbers with :meth:`_rand_range` or
    ``trainkit.data.mapping.record_mapper.augmentation_rng()`` so that a loader can repeat them.
    """

    input_args: tuple[str, ...] | None = None
    """Names of the input's fields passed to ``get_transform`` (default: its parameters)."""

    def _init(self, params: dict[str, Any] | None = None) -> None:
        """Store constructor arguments as attributes (pass ``locals()``)."""
        for name, value in (params or {}).items():
            if name != "self" and not name.startswith("_"):
                setattr(self, name, value)

    def get_transform(self, *args: Any) -> Transform:
        """Choose the transform for these inputs (the fields named by ``input_args``)."""
        raise NotImplementedError

    def __call__(self, aug_input: Any) -> Transform:
        """Transform ``aug_input`` in place with the chosen transform; return the transform.

        Raises:
            AttributeError: If the input lacks a field ``get_transform`` needs.
            TypeError: If ``get_transform`` returns something other than a ``Transform``.
        """
        args = []
        for name in _input_args(self):
            try:
                args.append(getattr(aug_input, name))
            except AttributeError as e:
                raise AttributeError(
                    f"{self}.get_transform needs {name!r}, which {type(aug_input).__name__} "
                    "does not have"
                ) from e
        tfm = self.get_transform(*args)
        if not isinstance(tfm, Transform):  # a TransformList is one too
            raise TypeError(
                f"{type(self).__name__}.get_transform must return a Transform, got "
                f"{type(tfm).__name__}"
            )
        aug_input.transform(tfm)
        return tfm

    def _rand_range(self, low: float = 1.0, high: float | None = None, size: Any = None) -> Any:
        """Uniform random number(s) in ``[low, high)`` (``[0, low)`` if ``high`` is None)."""
        if high is None:
            low, high = 0.0, low
        if size is None:
            # The very number uniform(low, high) draws (numpy computes low + range * the
            # next double), at a quarter of its cost: every RandomFlip of every record.
            return low + (high - low) * augmentation_rng().random()
        return augmentation_rng().uniform(low, high, size)

    def __repr__(self) -> str:
        """``Name(arg=value, ...)`` for the constructor arguments that differ from defaults."""
        try:
            params = inspect.signature(self.__init__).parameters
        except (TypeError, ValueError):
            return super().__repr__()
        parts = []
        for name, param in params.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or not hasattr(self, name):
                return super().__repr__()
            value = getattr(self, name)
            if param.default is value:
                continue
            text = pprint.pformat(value)
            parts.append(f"{name}={'...' if chr(10) in text else text}")
        return f"{type(self).__name__}({', '.join(parts)})"

    __str__ = __repr__


class _FixedTransform(Augmentation):
    """A plain ``Transform`` in an augmentation list: applied as it is."""

    def __init__(self, tfm: Transform):
        self.tfm = tfm

    def get_transform(self, *args: Any) -> Transform:
        return self.tfm

    def __call__(self, aug_input: Any) -> Transform:
        aug_input.transform(self.tfm)
        return self.tfm

    def __repr__(self) -> str:
        return repr(self.tfm)

    __str__ = __repr__


def _as_augmentation(tfm_or_aug: Transform | Augmentation) -> Augmentation:
    """Return an augmentation; a ``Transform`` becomes one that always returns it."""
    if isinstance(tfm_or_aug, Augmentation):
        return tfm_or_aug
    if isinstance(tfm_or_aug, Transform):
        return _FixedTransform(tfm_or_aug)
    raise TypeError(f"expected an Augmentation or a Transform, got {type(tfm_or_aug).__name__}")


class AugmentationList(Augmentation):
    """Apply augmentations (or plain transforms) in order; return them as a ``TransformList``."""

    def __init__(self, augs: Sequence[Augmentation | Transform]):
        """Args: ``augs``: augmentations and/or transforms, applied in this order."""
        super().__init__()
        self.augs = [_as_augmentation(a) for a in augs]

    def __call__(self, aug_input: Any) -> TransformList:
        """Apply each in turn to ``aug_input`` (in place); return the transforms applied."""
        return TransformList([aug(aug_input) for aug in self.augs])

    def __repr__(self) -> str:
        return f"AugmentationList[{', '.join(str(a) for a in self.augs)}]"

    __str__ = __repr__


class AugInput:
    """The fields most augmentations need: ``image``, and optionally ``boxes`` and ``sem_seg``.

    ``transform(tfm)`` applies a transform to all of them in place. Anything else that
    must follow the image (points, a project's own annotations) is transformed by the
    caller with the ``TransformList`` that :meth:`apply_augmentations` returns. An
    augmentation that needs other fields works with any object that has them as
    attributes and a ``transform(tfm)`` method.

    Example::

        aug_input = AugInput(image, sem_seg=labels)
        tfms = AugmentationList([ResizeShortestEdge(32), RandomFlip()])(aug_input)
        image, labels = aug_input.image, aug_input.sem_seg
        points = tfms.apply_coords(points)
    """

    def __init__(
        self,
        image: np.ndarray,
        *,
        boxes: np.ndarray | None = None,
        sem_seg: np.ndarray | None = None,
    ):
        """Args: ``image`` ``HxW`` / ``HxWxC`` (uint8 or float); ``boxes`` ``Nx4`` XYXY in
        pixels; ``sem_seg`` ``HxW`` labels.

        Raises:
            TypeError, ValueError: If the image is not such an array.
        """
        _check_image(image)
        self.image = image
        self.boxes = boxes
        self.sem_seg = sem_seg

    def transform(self, tfm: Transform) -> None:
        """Apply ``tfm`` to the image and, where set, the boxes and the label map."""
        self.image = tfm.apply_image(self.image)
        if self.boxes is not None:
            self.boxes = tfm.apply_box(self.boxes)
        if self.sem_seg is not None:
            self.sem_seg = tfm.apply_segmentation(self.sem_seg)

    def apply_augmentations(
        self, augmentations: Sequence[Augmentation | Transform]
    ) -> TransformList:
        """Apply ``augmentations`` in order, in place; return the transforms applied."""
        return AugmentationList(augmentations)(self)


def apply_augmentations(
    augmentations: Sequence[Augmentation | Transform], inputs: np.ndarray | AugInput
) -> tuple[Any, TransformList]:
    """Apply ``augmentations`` to an image array or an :class:`AugInput`.

    Returns:
        ``(new image, transforms)`` for an array; ``(the input, transforms)`` for an
        ``AugInput`` (transformed in place).
    """
    if isinstance(inputs, np.ndarray):
        aug_input = AugInput(inputs)
        tfms = aug_input.apply_augmentations(augmentations)
        return aug_input.image, tfms
    return inputs, inputs.apply_augmentations(augmentations)


apply_transform_gens = apply_augmentations  # detectron2's older name
StandardAugInput = AugInput  # detectron2's older name
TransformGen = Augmentation  # detectron2's older name
