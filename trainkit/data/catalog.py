"""The catalogs (``DatasetCatalog``: name -> records, ``MetadataCatalog``) and loading by name.

Both catalogs are process-wide registries, the allowed globals of this package; tests reset
them with ``clear()``. :func:`load_catalog_dataset` and detectron2's
:func:`get_detection_dataset_dicts` turn ``DATASETS.TRAIN``/``DATASETS.TEST`` names into a
dataset (both exported by :mod:`trainkit.data.build`, detectron2's path).
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch.utils.data import ChainDataset, ConcatDataset, Dataset, IterableDataset

from trainkit.config import ConfigError
from trainkit.data.dataset_from_list import DatasetFromList
from trainkit.utils.errors import UnknownNameError

logger = logging.getLogger(__name__)

__all__ = [
    "DatasetCatalog",
    "Metadata",
    "MetadataCatalog",
    "get_detection_dataset_dicts",
    "joined_names",
    "load_catalog_dataset",
]


def _unknown_name_message(kind: str, name: str, known: list[str], how_to_add: str) -> str:
    close = difflib.get_close_matches(name, known, n=3)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    listed = ", ".join(repr(k) for k in sorted(known)) or "(none)"
    return f"{kind} {name!r} is not registered.{hint} Registered: {listed}. {how_to_add}"


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


def joined_names(names: str | Sequence[str]) -> str:
    """One dataset name, or several joined by commas (a name for messages)."""
    return names if isinstance(names, str) else ",".join(names)


def _names(names: str | Sequence[str]) -> list[str]:
    names = [names] if isinstance(names, str) else list(names)
    if not names:
        raise ConfigError(
            "no dataset given: set DATASETS.TRAIN (or DATASETS.TEST) to registered dataset names"
        )
    return names


def _catalog_part(names: list[str], name: str, dataset: bool | None = None) -> Any:
    """Call ``name``'s catalog function (one of ``names``); return what it gives.

    Refuses (``ConfigError``) an empty map-style dataset, and a dataset object or records
    where ``dataset`` (True / False) asks for the other kind.
    """
    part = DatasetCatalog.get(name)
    if dataset is not None and isinstance(part, Dataset) != dataset:
        raise ConfigError(
            f"datasets {names} mix dataset objects and record lists ({name!r} gives a "
            f"{type(part).__name__}); register all of them one way, or list them in separate "
            "runs."
        )
    # A dataset object (e.g. MetaFileDataset) reads its records on demand; a list or a
    # generator is records to serialise. An IterableDataset may have no length (or be
    # infinite): it is not checked.
    sized = isinstance(part, Dataset) and not isinstance(part, IterableDataset)
    if sized and hasattr(part, "__len__") and len(part) == 0:
        raise _empty_dataset(name)
    return part


def _empty_dataset(name: str) -> ConfigError:
    return ConfigError(
        f"dataset {name!r} is empty: its DatasetCatalog function returned no record; check "
        "the files it reads, or remove it from DATASETS.TRAIN/DATASETS.TEST."
    )


def keep_record(record: Any, *, filter_empty: bool, min_keypoints: int = 0) -> bool:
    """Return whether ``record`` survives detectron2's training-time filters.

    Only records with an ``"annotations"`` list are filtered: ``filter_empty`` drops those
    without a non-crowd annotation, ``min_keypoints`` those with fewer visible keypoints.
    """
    if not isinstance(record, dict) or "annotations" not in record:
        return True
    annotations = record["annotations"]
    # detectron2's rule: an image is kept if one of its annotations is not a crowd region.
    if filter_empty and all(ann.get("iscrowd", 0) for ann in annotations):
        return False
    # Keypoints are [x1, y1, v1, x2, y2, v2, ...]; visible means v > 0.
    visible = sum(v > 0 for ann in annotations for v in ann.get("keypoints", [])[2::3])
    return min_keypoints <= 0 or visible >= min_keypoints


def get_detection_dataset_dicts(
    names: str | Sequence[str],
    filter_empty: bool = True,
    min_keypoints: int = 0,
    proposal_files: Sequence[str] | None = None,
    check_consistency: bool = True,
) -> list[dict[str, Any]] | Dataset:
    """Fetch the named datasets from ``DatasetCatalog`` and concatenate them.

    Record lists (and generators) are concatenated in this process (the loaders write them
    into one shared copy instead: :func:`load_catalog_dataset`); dataset objects are returned
    as they are (several: concatenated, iterable ones chained), as in detectron2.

    Args:
        names: one dataset name or several.
        filter_empty, min_keypoints: drop records whose ``"annotations"`` hold no non-crowd
            annotation, or fewer visible keypoints than ``min_keypoints`` (0: keep all).
        proposal_files: precomputed proposals; not supported by trainkit (must be ``None``).
        check_consistency: refuse datasets whose metadata ``thing_classes`` differ.

    Raises:
        ConfigError: A ``ValueError``: if no name is given, a dataset is empty (before or
            after filtering), or the datasets' ``thing_classes`` differ.
        UnknownNameError: A ``KeyError`` listing the registered names, for an unknown one.
        NotImplementedError: If ``proposal_files`` is given.
    """
    names = _names(names)
    if proposal_files is not None:
        raise NotImplementedError(
            "trainkit does not load precomputed proposals: pass proposal_files=None (and keep "
            "MODEL.LOAD_PROPOSALS off)."
        )
    found = _named_datasets(names, filter_empty, min_keypoints)
    if isinstance(found, Dataset):
        return found
    records = list(found)
    if check_consistency:
        declared = {
            name: classes
            for name in names
            if (classes := MetadataCatalog.get(name).get("thing_classes")) is not None
        }
        if len({tuple(classes) for classes in declared.values()}) > 1:
            raise ConfigError(
                f"datasets {names} have different MetadataCatalog thing_classes {declared}; "
                "train on datasets with the same classes, or pass check_consistency=False."
            )
    return records


def _named_datasets(
    names: list[str], filter_empty: bool, min_keypoints: int = 0
) -> Dataset | Iterator[Any]:
    """The named dataset objects joined, or their filtered records, one at a time."""
    # The first function tells the kind; what it returned is used, not fetched twice.
    first = _catalog_part(names, names[0])
    if not isinstance(first, Dataset):
        return _iter_dataset_dicts(names, first, filter_empty, min_keypoints)
    parts = [first] + [_catalog_part(names, name, dataset=True) for name in names[1:]]
    iterable = [isinstance(part, IterableDataset) for part in parts]
    if len(parts) == 1:
        return first
    if all(iterable):
        return ChainDataset(parts)
    if any(iterable):
        raise ConfigError(
            f"datasets {names} mix iterable and map-style datasets; list only one kind in "
            "DATASETS.TRAIN/DATASETS.TEST."
        )
    return ConcatDataset(parts)


def _iter_dataset_dicts(
    names: list[str], first: Any, filter_empty: bool, min_keypoints: int
) -> Iterator[Any]:
    # Reads one catalog function's records at a time, so that no rank holds the
    # concatenation of all of them. ``first``: names[0]'s records, already fetched.
    seen = kept = 0
    for i, name in enumerate(names):
        part = first if i == 0 else _catalog_part(names, name, dataset=False)
        first = None
        before = seen
        for record in part:
            seen += 1
            if keep_record(record, filter_empty=filter_empty, min_keypoints=min_keypoints):
                kept += 1
                yield record
        if seen == before:
            raise _empty_dataset(name)
        del part
    if kept < seen:
        logger.info("Filters removed %d records; %d left", seen - kept, kept)
    if kept == 0:
        raise ConfigError(
            f"no valid records in {','.join(names)} after filtering: every record has no "
            "non-crowd annotation (or too few keypoints); fix the annotations, or set "
            "DATALOADER.FILTER_EMPTY_ANNOTATIONS False."
        )


def load_catalog_dataset(names: str | Sequence[str], *, filter_empty: bool = False) -> Dataset:
    """Return the named catalog datasets as one dataset, one copy of the records per machine.

    Every rank calls the catalog functions and writes the records (a list or a generator,
    never held whole) one by one into a :class:`DatasetFromList`, which the ranks of a machine
    share. A dataset object (e.g. ``MetaFileDataset(path)``, or an ``IterableDataset``) is
    used as it is. Several names are concatenated (iterable datasets: chained).

    Args:
        names: one dataset name or several.
        filter_empty: ``DATALOADER.FILTER_EMPTY_ANNOTATIONS`` (see :func:`keep_record`).

    Raises:
        ConfigError: A ``ValueError``: if no name is given, a dataset is empty, or record
            lists and dataset objects are mixed.
        UnknownNameError: A ``KeyError``: if a name is not registered.
    """
    found = _named_datasets(_names(names), filter_empty)
    return found if isinstance(found, Dataset) else DatasetFromList(found, copy=False)
