"""Placeholders for detectron2's detection-only names: they import, and using one says why not.

trainkit does not do detection (boxes, instances, masks, keypoints, COCO/LVIS/VOC evaluation,
R-CNN models). Scripts copied from detectron2's ``tools/train_net.py`` import such names even
when they never use them, so each exists at detectron2's import path as a placeholder made by
:func:`detection_only`. Importing it, subclassing it (``class MyEvaluator(COCOEvaluator)``) and
``isinstance`` checks work; calling it, reading one of its public attributes
(``BoxMode.XYXY_ABS``), or iterating or indexing it (a table such as ``COCO_CATEGORIES``) raises
:class:`DetectionOnlyError` with one line naming the feature and what to do.

Where the placeholders live: a name detectron2 exports from a package (``modeling.ROIHeads``)
is made in that package's ``__init__``, and a module holding nothing but placeholders
(``modeling/roi_heads/roi_heads.py``) re-exports it from there and makes only its own extra
names. Such a module sets ``_PLACEHOLDER_MODULE = True``, and no ``__init__`` imports it, so it
loads only when a script imports it by its own path; the tests check both with that marker.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any, NoReturn

from trainkit.utils.errors import UsageError

__all__ = [
    "DetectionOnlyError",
    "detection_only",
    "detection_only_method",
    "make_module_callable_as",
]


class DetectionOnlyError(UsageError, NotImplementedError):
    """A detection-only name of detectron2 was used; trainkit does not implement it."""


def _message(name: str, feature: str, detectron2_name: str, advice: str) -> str:
    return (
        f"{name} is {feature}: keep using detectron2's {detectron2_name} for this part, "
        f"or {advice}."
    )


def _detection_feature(feature: str) -> str:
    return f"detection-only ({feature}) and trainkit does not do detection"


class _DetectionOnly(type):
    """Metaclass of the placeholders: creating a subclass works, calling one raises."""

    _detection_only_message: str

    def __call__(cls, *args: Any, **kwargs: Any) -> NoReturn:
        raise DetectionOnlyError(cls._detection_only_message)

    # detectron2's tables (COCO_CATEGORIES, LVIS's CATEGORIES) are read by iterating or
    # indexing them. No __len__: truthiness (`if x:`) would call it.
    def __iter__(cls) -> NoReturn:
        raise DetectionOnlyError(cls._detection_only_message)

    def __getitem__(cls, key: Any) -> NoReturn:
        raise DetectionOnlyError(cls._detection_only_message)

    def __getattr__(cls, key: str) -> NoReturn:
        # Only called for attributes the class lacks. Dunder and private lookups (pickle,
        # inspect, pytest collection, typing) must keep seeing an ordinary AttributeError.
        if key.startswith("_"):
            raise AttributeError(key)
        raise DetectionOnlyError(cls._detection_only_message)


def detection_only(
    name: str, module: str, feature: str, advice: str = "", *, reason: str | None = None
) -> type:
    """Return a placeholder for detectron2's detection-only ``name`` defined in ``module``.

    Args:
        name: the name as detectron2 spells it (``"COCOEvaluator"``).
        module: trainkit's module that exports it (``__name__`` of the caller); the message
            names detectron2's counterpart of it.
        feature: what the name does, in a few words (``"COCO box/mask AP evaluation"``).
        advice: the alternative to keeping detectron2's implementation; the default says to
            port the code into your project.
        reason: replaces "detection-only (feature) and trainkit does not do detection" in
            the message, for the few names trainkit leaves out for another reason.

    Returns:
        A class whose instantiation (or call, for a detectron2 function) and public attribute
        reads raise :class:`DetectionOnlyError`.
    """
    detectron2_name = f"{module.replace('trainkit.', '', 1)}.{name}"
    what = reason or _detection_feature(feature)
    message = _message(name, what, detectron2_name, advice or "port its code into your project")
    namespace = {
        "__module__": module,
        "__qualname__": name,
        "__doc__": f"Detection-only placeholder for detectron2's ``{name}``: {message}",
        "_detection_only_message": message,
    }
    return _DetectionOnly(name, (), namespace)


def detection_only_method(name: str, feature: str, owner: str) -> Callable[..., NoReturn]:
    """Return a method that raises :class:`DetectionOnlyError` (a detection drawing, ...).

    Args:
        name: the method's name (``"draw_instance_predictions"``).
        feature: what it does, in a few words.
        owner: detectron2's class that has it, from its package (``"utils.visualizer.Visualizer"``).
    """
    message = _message(
        name, _detection_feature(feature), f"{owner}.{name}", "port that drawing into your project"
    )

    def method(self: Any, *args: Any, **kwargs: Any) -> NoReturn:
        raise DetectionOnlyError(message)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"Detection-only: {message}"
    return method


class _CallablePlaceholderModule(types.ModuleType):
    """A module of placeholders that raises, when called, as the function it is named after."""

    _detection_only_message: str

    def __call__(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise DetectionOnlyError(self._detection_only_message)


def make_module_callable_as(module_name: str, placeholder: type) -> None:
    """Make the module ``module_name`` raise as ``placeholder`` does when it is called.

    detectron2's ``layers`` package exports functions named like the modules defining them
    (``nms`` of ``layers/nms.py``, ``roi_align``, ``roi_align_rotated``). trainkit's package
    makes those placeholders itself, without importing the modules; but once a script
    imports such a module by its path, Python sets the package's attribute to the module,
    replacing the function. Called through the package after that, the module then raises
    the function's one-line error instead of "'module' object is not callable".

    Args:
        module_name: the placeholder module (its ``__name__``), already in ``sys.modules``.
        placeholder: the function placeholder of the same name, from :func:`detection_only`.
    """
    module = sys.modules[module_name]
    module.__class__ = _CallablePlaceholderModule
    module._detection_only_message = placeholder._detection_only_message
