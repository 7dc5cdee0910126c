"""Turn ``DatasetCatalog`` names into records or datasets, once per machine where possible.

Re-exported by :mod:`trainkit.data.build` (detectron2's import path).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from torch.utils.data import ChainDataset, ConcatDataset, Dataset, IterableDataset

from trainkit.config import ConfigError
from trainkit.data.catalog import DatasetCatalog, MetadataCatalog
from trainkit.data.dataset_from_list import DatasetFromList

logger = logging.getLogger(__name__)

__all__ = ["get_detection_dataset_dicts", "load_catalog_dataset"]


def _names(names: str | Sequence[str]) -> list[str]:
    names = [names] if isinstance(names, str) else list(names)
    if not names:
        raise ConfigError(
            "no dataset given: set DATASETS.TRAIN (or DATASETS.TEST) to registered dataset names"
        )
    return names


def _is_lazy_dataset(obj: Any) -> bool:
    # A dataset object (e.g. MetaFileDataset, or an IterableDataset) reads its records on
    # demand; a list, tuple or generator is records to serialise.
    return isinstance(obj, Dataset) and not isinstance(obj, (list, tuple))


def _empty_dataset(name: str) -> ConfigError:
    return ConfigError(
        f"dataset {name!r} is empty: its DatasetCatalog function returned no record; check "
        "the files it reads, or remove it from DATASETS.TRAIN/DATASETS.TEST."
    )


def _check_not_empty(name: str, part: Any) -> None:
    # An IterableDataset may have no length (or an infinite stream): it is not checked.
    if isinstance(part, IterableDataset) or not hasattr(part, "__len__"):
        return
    if len(part) == 0:
        raise _empty_dataset(name)


def _catalog_part(name: str, *, as_list: bool = True) -> Any:
    """Call ``name``'s catalog function; a generator stays one unless ``as_list``.

    Raises:
        ConfigError: If the dataset is empty (for a generator: once it turns out empty).
        UnknownNameError: If ``name`` is not registered.
    """
    part = DatasetCatalog.get(name)
    if not _is_lazy_dataset(part) and not isinstance(part, (list, tuple)):
        part = list(part) if as_list else _non_empty(name, part)
    _check_not_empty(name, part)
    return part


def _non_empty(name: str, records: Iterable[Any]) -> Iterator[Any]:
    count = 0
    for count, record in enumerate(records, 1):  # noqa: B007 - count is read afterwards
        yield record
    if count == 0:
        raise _empty_dataset(name)


def _join_datasets(names: list[str], parts: list[Any]) -> Dataset:
    """One dataset from several dataset objects (map-style: concatenated; iterable: chained)."""
    if not all(_is_lazy_dataset(part) for part in parts):
        raise ConfigError(
            f"datasets {names} mix dataset objects and record lists; register all of them one "
            "way, or list them in separate runs."
        )
    if len(parts) == 1:
        return parts[0]
    iterable = [isinstance(part, IterableDataset) for part in parts]
    if all(iterable):
        return ChainDataset(parts)
    if any(iterable):
        raise ConfigError(
            f"datasets {names} mix iterable and map-style datasets; list only one kind in "
            "DATASETS.TRAIN/DATASETS.TEST."
        )
    return ConcatDataset(parts)


def _has_usable_annotations(record: Any) -> bool:
    # detectron2's rule: an image is kept if one of its annotations is not a crowd region.
    return any(not ann.get("iscrowd", 0) for ann in record["annotations"])


def _num_visible_keypoints(record: Any) -> int:
    # Keypoints are [x1, y1, v1, x2, y2, v2, ...]; visible means v > 0.
    return sum(
        sum(1 for v in ann["keypoints"][2::3] if v > 0)
        for ann in record["annotations"]
        if "keypoints" in ann
    )


def keep_record(record: Any, *, filter_empty: bool, min_keypoints: int = 0) -> bool:
    """Return whether ``record`` survives detectron2's training-time filters.

    Only records with an ``"annotations"`` list are filtered: ``filter_empty`` drops those
    without a non-crowd annotation, ``min_keypoints`` those with fewer visible keypoints.
    """
    if not isinstance(record, dict) or "annotations" not in record:
        return True
    if filter_empty and not _has_usable_annotations(record):
        return False
    return min_keypoints <= 0 or _num_visible_keypoints(record) >= min_keypoints


def _check_thing_classes(names: list[str]) -> None:
    """Raise if the named datasets declare different ``thing_classes`` in their metadata."""
    declared = {
        name: MetadataCatalog.get(name).get("thing_classes")
        for name in names
        if MetadataCatalog.get(name).get("thing_classes") is not None
    }
    if len({tuple(classes) for classes in declared.values()}) > 1:
        raise ConfigError(
            f"datasets {names} have different MetadataCatalog thing_classes {declared}; train "
            "on datasets with the same classes, or pass check_consistency=False."
        )


def get_detection_dataset_dicts(
    names: str | Sequence[str],
    filter_empty: bool = True,
    min_keypoints: int = 0,
    proposal_files: Sequence[str] | None = None,
    check_consistency: bool = True,
) -> list[dict[str, Any]] | Dataset:
    """Fetch the named datasets from ``DatasetCatalog`` and concatenate them.

    Record lists (and generators) are materialised in this process and concatenated; the
    loaders stream them into one shared copy instead (see :func:`load_catalog_dataset`). When the
    catalog functions return dataset objects (map-style or iterable), those are returned
    as they are (several: concatenated, or chained for iterables), as in detectron2.

    Args:
        names: one dataset name or several.
        filter_empty: drop records whose ``"annotations"`` hold no non-crowd annotation.
        min_keypoints: drop records with fewer visible keypoints (0: keep all).
        proposal_files: precomputed proposals; not supported by trainkit (must be ``None``).
        check_consistency: refuse datasets whose metadata ``thing_classes`` differ.

    Returns:
        The records, or a dataset object.

    Raises:
        ConfigError: A ``ValueError``: if no name is given, a dataset is empty (before or
            after filtering), or the datasets' ``thing_classes`` differ.
        UnknownNameError: A ``KeyError``: if a name is not registered (the message lists
            the registered ones).
        NotImplementedError: If ``proposal_files`` is given.
    """
    names = _names(names)
    if proposal_files is not None:
        raise NotImplementedError(
            "trainkit does not load precomputed proposals: pass proposal_files=None (and keep "
            "MODEL.LOAD_PROPOSALS off)."
        )
    parts = [_catalog_part(name) for name in names]
    if any(_is_lazy_dataset(part) for part in parts):
        return _join_datasets(names, parts)  # refuses record lists mixed with datasets
    records: list[dict[str, Any]] = [record for part in parts for record in part]
    num_before = len(records)
    records = [
        r for r in records if keep_record(r, filter_empty=filter_empty, min_keypoints=min_keypoints)
    ]
    if len(records) < num_before:
        logger.info("Filters removed %d records; %d left", num_before - len(records), len(records))
    if not records:
        raise _nothing_left(names)
    if check_consistency:
        _check_thing_classes(names)
    return records


def _iter_dataset_dicts(names: list[str], first: Any, filter_empty: bool) -> Iterator[Any]:
    # Streams one catalog function's records at a time into the serialiser, so no rank
    # holds the concatenation of all of them. ``first``: names[0]'s records, if fetched.
    kept = 0
    for i, name in enumerate(names):
        part = first if i == 0 and first is not None else _catalog_part(name, as_list=False)
        first = None
        if _is_lazy_dataset(part):
            raise ConfigError(
                f"dataset {name!r} is a dataset object ({type(part).__name__}) while others in "
                f"{names} are lists of records; register all of them one way."
            )
        for record in part:
            if keep_record(record, filter_empty=filter_empty):
                kept += 1
                yield record
        del part
    if kept == 0:
        raise _nothing_left(names)


def _nothing_left(names: list[str]) -> ConfigError:
    return ConfigError(
        f"no valid records in {','.join(names)} after filtering: every record has no non-crowd "
        "annotation (or too few keypoints); fix the annotations, or set "
        "DATALOADER.FILTER_EMPTY_ANNOTATIONS False."
    )


def load_catalog_dataset(names: str | Sequence[str], *, filter_empty: bool = False) -> Dataset:
    """Return the named catalog datasets as one dataset, one copy of the records per machine.

    Every rank calls the catalog functions. Records (a list or a generator) are streamed
    into a :class:`DatasetFromList` (a generator is never held as a whole), and the ranks of
    a machine share one copy of them, found by content (:mod:`trainkit.data.segment_sharing`:
    no collective, so it works under any launcher). Functions that return a dataset object
    (e.g. ``lambda: MetaFileDataset(path)``, or an ``IterableDataset``) give it as it is:
    such datasets read records on demand. Several names are concatenated (iterable
    datasets: chained).

    Args:
        names: one dataset name or several.
        filter_empty: drop records whose ``"annotations"`` hold no non-crowd annotation
            (``DATALOADER.FILTER_EMPTY_ANNOTATIONS``; records without the key are kept).

    Raises:
        ConfigError: A ``ValueError``: if no name is given, a dataset is empty, or record
            lists and dataset objects are mixed.
        UnknownNameError: A ``KeyError``: if a name is not registered.
    """
    names = _names(names)
    # The first function tells the kind; what it returned is used, not fetched twice.
    first = _catalog_part(names[0], as_list=False)
    if _is_lazy_dataset(first):
        return _join_datasets(names, [first] + [_catalog_part(name) for name in names[1:]])
    return DatasetFromList(_iter_dataset_dicts(names, first, filter_empty), copy=False)
