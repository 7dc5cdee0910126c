"""Loading datasets by catalog name; detectron2's import path of the catalogs.

``DatasetCatalog`` and ``MetadataCatalog`` are defined in :mod:`trainkit.utils.catalog`
(every package may look a dataset up) and exported here. :func:`load_catalog_dataset` and
detectron2's :func:`get_detection_dataset_dicts` turn ``DATASETS.TRAIN``/``DATASETS.TEST``
names into a dataset (:func:`load_catalog_parts` also into how many records each adds).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

from torch.utils.data import ChainDataset, ConcatDataset, Dataset, IterableDataset

from trainkit.config import ConfigError
from trainkit.data.records.dataset_from_list import DatasetFromList
from trainkit.utils.catalog import DatasetCatalog, Metadata, MetadataCatalog

logger = logging.getLogger(__name__)

__all__ = [
    "DatasetCatalog",
    "Metadata",
    "MetadataCatalog",
    "get_detection_dataset_dicts",
    "joined_names",
    "load_catalog_dataset",
    "load_catalog_parts",
]


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
    names: list[str],
    filter_empty: bool,
    min_keypoints: int = 0,
    sizes: dict[str, int] | None = None,
) -> Dataset | Iterator[Any]:
    """The named datasets joined, or their filtered records one by one (``sizes``: per name)."""
    # The first function tells the kind; what it returned is used, not fetched twice.
    first = _catalog_part(names, names[0])
    if not isinstance(first, Dataset):
        return _iter_dataset_dicts(names, first, filter_empty, min_keypoints, sizes)
    parts = [first] + [_catalog_part(names, name, dataset=True) for name in names[1:]]
    iterable = [isinstance(part, IterableDataset) for part in parts]
    if sizes is not None and not any(iterable):
        sizes.update((name, len(part)) for name, part in zip(names, parts))  # type: ignore[arg-type]
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
    names: list[str],
    first: Any,
    filter_empty: bool,
    min_keypoints: int,
    sizes: dict[str, int] | None = None,
) -> Iterator[Any]:
    # Reads one catalog function's records at a time, so that no rank holds the
    # concatenation of all of them. ``first``: names[0]'s records, already fetched.
    seen = kept = 0
    for i, name in enumerate(names):
        part = first if i == 0 else _catalog_part(names, name, dataset=False)
        first = None
        before, kept_before = seen, kept
        for record in part:
            seen += 1
            if keep_record(record, filter_empty=filter_empty, min_keypoints=min_keypoints):
                kept += 1
                yield record
        if seen == before:
            raise _empty_dataset(name)
        if sizes is not None:
            sizes[name] = kept - kept_before
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
    return load_catalog_parts(names, filter_empty=filter_empty)[0]


def load_catalog_parts(
    names: str | Sequence[str], *, filter_empty: bool = False
) -> tuple[Dataset, dict[str, int] | None]:
    """Return :func:`load_catalog_dataset`'s dataset and how many records each name adds.

    Dataset index ``i`` of the joined dataset is record ``i - (records of the names before)``
    of its name; the sizes are counted while the records are read (``None`` for streams).

    Raises:
        ConfigError, UnknownNameError: As :func:`load_catalog_dataset`.
    """
    names = _names(names)
    sizes: dict[str, int] = {}
    found = _named_datasets(names, filter_empty, sizes=sizes)
    dataset = found if isinstance(found, Dataset) else DatasetFromList(found, copy=False)
    return dataset, (sizes if len(sizes) == len(names) else None)
