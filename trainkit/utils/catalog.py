"""The dataset catalogs: ``DatasetCatalog`` (name -> records) and ``MetadataCatalog``.

Both are process-wide registries (the allowed globals of their kind, beside the model
registries); tests reset them with ``clear()``. They live in ``utils`` so that every package
above may look a dataset up (an evaluator its ground truth and class names, a visualiser its
colours); ``trainkit.data`` and ``trainkit.data.catalog`` (detectron2's paths) export them.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Any

from trainkit.utils.errors import UnknownNameError

__all__ = ["DatasetCatalog", "Metadata", "MetadataCatalog"]


def _unknown_name_message(kind: str, name: str, known: list[str], how_to_add: str) -> str:
    close = difflib.get_close_matches(name, known, n=3)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    listed = ", ".join(repr(k) for k in sorted(known)) or "(none)"
    return f"{kind} {name!r} is not registered.{hint} Registered: {listed}. {how_to_add}"


# Name prefixes of the datasets detectron2 registers when it is imported
# (detectron2/data/datasets/builtin.py).
_DETECTRON2_BUILTIN_DATASETS = (
    "coco_",
    "keypoints_coco_",
    "lvis_",
    "cityscapes_",
    "voc_",
    "ade20k_",
)


class _Catalog:
    """What both catalogs share: entries by name, in the order they were added."""

    _kind = "Dataset"  # what a name is called in messages

    def __init__(self) -> None:
        self._entries: dict[str, Any] = {}

    def list(self) -> list[str]:
        """Return the names, in the order they were added."""
        return list(self._entries)

    def remove(self, name: str) -> None:
        """Forget ``name``.

        Raises:
            KeyError: If ``name`` is not in the catalog.
        """
        if name not in self._entries:
            raise KeyError(_unknown_name_message(self._kind, name, self.list(), ""))
        del self._entries[name]

    def clear(self) -> None:
        """Forget every entry (tests use this to reset the global catalog)."""
        self._entries.clear()


class _DatasetCatalog(_Catalog):
    """Map a dataset name to a function that returns its records (a list of dicts).

    The function is called on every :meth:`get`: registering is cheap, records load when used.
    """

    def register(self, name: str, func: Callable[[], Any]) -> None:
        """Register ``func`` (no arguments, returns the records) under ``name``.

        Raises:
            TypeError: If ``func`` is not callable.
            ValueError: If ``name`` is already registered.
        """
        if not callable(func):
            raise TypeError(
                f"DatasetCatalog.register({name!r}, ...) needs a callable, got {func!r}"
            )
        if name in self._entries:
            raise ValueError(
                f"Dataset {name!r} is already registered; pick another name or call "
                f"DatasetCatalog.remove({name!r}) first."
            )
        self._entries[name] = func

    def get(self, name: str) -> Any:
        """Call the function registered as ``name`` and return its records.

        Raises:
            UnknownNameError: A ``KeyError``: if ``name`` is unknown; the message lists the
                registered names.
        """
        if name not in self._entries:
            how = "Register it with DatasetCatalog.register(name, func) or fix DATASETS.TRAIN/TEST."
            if name.startswith(_DETECTRON2_BUILTIN_DATASETS):
                how = (
                    f"{name!r} is one of detectron2's builtin datasets (COCO, LVIS, VOC, "
                    "Cityscapes, ADE20K), which trainkit does not register (most are detection "
                    "data, all need their files): register it yourself with "
                    "DatasetCatalog.register(name, func), e.g. with load_sem_seg for semantic "
                    "segmentation, or fix DATASETS.TRAIN/TEST."
                )
            raise UnknownNameError(_unknown_name_message("Dataset", name, self.list(), how))
        return self._entries[name]()

    def keys(self) -> set[str]:
        """Return the registered names as a set (detectron2's ``DatasetCatalog.keys()``)."""
        return set(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __repr__(self) -> str:
        return f"DatasetCatalog(registered: {', '.join(self._entries) or '(none)'})"


class Metadata:
    """An attribute bag of a dataset's metadata (class names, evaluator type, ...).

    An attribute is set once: setting it again to a *different* value raises (two pieces of
    code disagreeing about, e.g., class names is a bug); setting the same value is allowed.
    """

    def __init__(self, name: str) -> None:
        object.__setattr__(self, "name", name)

    def __getattr__(self, key: str) -> Any:
        # Only called when normal lookup fails.
        if key.startswith("__") or key == "name":
            raise AttributeError(key)
        raise AttributeError(
            f"Metadata of dataset {self.__dict__.get('name')!r} has no attribute {key!r}; "
            f"available: {', '.join(sorted(self.as_dict())) or '(none)'}."
        )

    def __setattr__(self, key: str, value: Any) -> None:
        current = self.__dict__.get(key, _MISSING)
        if current is not _MISSING and current != value:
            raise ValueError(
                f"Metadata {key!r} of dataset {self.name!r} is already {current!r}; refusing to "
                f"change it to {value!r}. Use another dataset name, or MetadataCatalog.remove()."
            )
        object.__setattr__(self, key, value)

    def set(self, **kwargs: Any) -> Metadata:
        """Set several attributes; returns ``self`` for chaining."""
        for key, value in kwargs.items():
            setattr(self, key, value)
        return self

    def get(self, key: str, default: Any = None) -> Any:
        """Return attribute ``key``, or ``default`` if it is not set."""
        return self.__dict__.get(key, default)

    def as_dict(self) -> dict[str, Any]:
        """Return a copy of every attribute."""
        return dict(self.__dict__)

    def __repr__(self) -> str:
        return f"Metadata({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


_MISSING = object()


class _MetadataCatalog(_Catalog):
    """Map a dataset name to its :class:`Metadata`, created empty on first :meth:`get`."""

    _kind = "Metadata of"

    def get(self, name: str) -> Metadata:
        """Return the metadata of ``name``, creating an empty one if needed."""
        if name not in self._entries:
            self._entries[name] = Metadata(name)
        return self._entries[name]


DatasetCatalog = _DatasetCatalog()
MetadataCatalog = _MetadataCatalog()
