"""Aspect-ratio grouping: each record's bucket, and the one implementation of grouping.

The batch plans, the loader workers of a stream dataset, ``AspectRatioGroupedDataset`` and
``GroupedBatchSampler`` all form their batches with :class:`Buckets`. A record's bucket comes
from its ``width`` / ``height`` and ``DATALOADER.ASPECT_RATIO_BINS``, read when a plan first
reaches it (:class:`LazyBucketIds`); a record without them (``load_sem_seg``'s) is measured by
its image's header (:func:`image_size_from_header`: a file open and a few hundred bytes).
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from trainkit.config import ConfigError
from trainkit.utils.file_io import PathManager

logger = logging.getLogger(__name__)

__all__ = [
    "BucketOf",
    "Buckets",
    "LazyBucketIds",
    "aspect_ratio_bucket_ids",
    "image_size_from_header",
    "record_aspect_ratio",
    "record_bucket_ids",
]

_TURN_OFF = "or set DATALOADER.ASPECT_RATIO_GROUPING False"

_EXIF_ORIENTATION = 0x0112
# EXIF orientations 5-8 turn the image by 90 degrees (transposed or not) when it is read
# upright, so its width and height swap; 1-4 only mirror or turn it by 180 degrees.
_QUARTER_TURNS = frozenset({5, 6, 7, 8})


def image_size_from_header(file_name: str) -> tuple[int, int]:
    """Return ``(width, height)`` of the image in ``file_name`` after its EXIF orientation.

    Only the header is read; the size is that of detectron2's ``read_image`` (turned upright).

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


def _stated_aspect_ratio(record: Any, index: int | None) -> float | None:
    """``width / height`` from the record's own fields; None if it lacks one of them."""
    try:
        width, height = record["width"], record["height"]
    except (KeyError, TypeError, IndexError):
        return None
    if width is None or height is None:  # a loader that writes every key, sizes unknown
        return None
    try:
        width, height = float(width), float(height)
    except (TypeError, ValueError):
        width = height = math.nan
    if not (width > 0 and height > 0):  # also NaN
        raise ConfigError(
            f"{_name(record, index)} has the size {record['width']!r}x{record['height']!r}; "
            f"give it a positive 'width' and 'height', {_TURN_OFF}."
        )
    return width / height


def _name(record: Any, index: int | None) -> str:
    """How messages name a record: its dataset index and its file, where known."""
    name = "a record" if index is None else f"record {index}"
    file_name = record.get("file_name") if isinstance(record, Mapping) else None
    return f"{name} ({file_name})" if file_name else name


def _file_name(record: Any, index: int | None) -> str:
    """The image file of a record without ``width``/``height`` (raises if it has none)."""
    file_name = record.get("file_name") if isinstance(record, Mapping) else None
    if not isinstance(file_name, str) or not file_name:
        raise ConfigError(
            f"{_name(record, index)} has no 'width'/'height' and no 'file_name' to read its "
            f"image size from; add 'width' and 'height' to the records, {_TURN_OFF}."
        )
    return file_name


def record_aspect_ratio(record: Any, index: int | None = None) -> float:
    """Return ``width / height`` of one record: its own fields, else its image's header.

    Args:
        record: a dataset record (dict).
        index: its dataset index, named in messages.

    Raises:
        ConfigError: A ``ValueError``: if the record has a non-positive size, or neither a
            size nor a readable image ``file_name``.
    """
    ratio = _stated_aspect_ratio(record, index)
    if ratio is not None:
        return ratio
    try:
        width, height = image_size_from_header(_file_name(record, index))
    except OSError as e:
        raise ConfigError(
            f"{_name(record, index)} has no 'width'/'height' and its image cannot be read "
            f"({type(e).__name__}: {e}); fix 'file_name' or add 'width' and 'height', "
            f"{_TURN_OFF}."
        ) from None
    return width / height


def aspect_ratio_bucket_ids(aspect_ratios: np.ndarray, bins: Sequence[float]) -> np.ndarray:
    """Return the bucket of each aspect ratio: ``i`` such that ``bins[i-1] <= ratio < bins[i]``.

    ``len(bins)`` increasing boundaries give ``len(bins) + 1`` buckets; ``[1.0]`` separates
    tall from wide images (a square one counts as wide).

    Raises:
        ConfigError: A ``ValueError``: for empty, non-positive or not strictly increasing ``bins``.
    """
    edges = np.asarray(list(bins), dtype=np.float64)
    if edges.size == 0 or (edges <= 0).any() or (np.diff(edges) <= 0).any():
        raise ConfigError(
            "DATALOADER.ASPECT_RATIO_BINS must be positive and strictly increasing, got "
            f"{list(bins)}; (1.0,) splits tall from wide images."
        )
    ratios = np.asarray(aspect_ratios, dtype=np.float64)
    return np.searchsorted(edges, ratios, side="right").astype(np.int16)


class BucketOf:
    """The aspect-ratio bucket of one record (picklable: stream datasets group in workers)."""

    def __init__(self, bins: Sequence[float]) -> None:
        """Take ``DATALOADER.ASPECT_RATIO_BINS`` (checked now)."""
        aspect_ratio_bucket_ids(np.ones(1), bins)
        # bisect_right over floats is aspect_ratio_bucket_ids' searchsorted(side="right").
        self.bins = [float(b) for b in bins]

    @property
    def num_buckets(self) -> int:
        """How many buckets the bins make."""
        return len(self.bins) + 1

    def __call__(self, record: Any) -> int:
        return bisect.bisect_right(self.bins, record_aspect_ratio(record))


class Buckets:
    """Items waiting for a batch, by bucket: the one implementation of grouping.

    Each item joins its bucket; a bucket that reaches ``batch_size`` is emptied and returned as a
    batch, so a batch never mixes buckets and follows the order of the items as closely as grouping
    allows. The waiting items (``waiting``: bucket -> items in arrival order) are the whole state.
    """

    def __init__(self, batch_size: int, waiting: dict[Hashable, list[Any]] | None = None) -> None:
        """Start with ``waiting`` (default: nothing) for batches of ``batch_size``."""
        self.batch_size = batch_size
        self.waiting: dict[Hashable, list[Any]] = {} if waiting is None else waiting

    def __iter__(self) -> Iterator[list[Any]]:
        """Iterate over the waiting items of each bucket (detectron2's list of buckets)."""
        return iter(list(self.waiting.values()))

    def __len__(self) -> int:
        """Return the number of buckets that have been used."""
        return len(self.waiting)

    @classmethod
    def from_lists(cls, batch_size: int, lists: Sequence[list[Any]]) -> Buckets:
        """Start from the waiting items of buckets ``0, 1, ...`` as a position stores them."""
        return cls(batch_size, {i: list(items) for i, items in enumerate(lists)})

    def to_lists(self, num_buckets: int) -> list[list[Any]]:
        """Return new lists of buckets ``0 .. num_buckets - 1``'s waiting items (items shared)."""
        return [list(self.waiting.get(i, ())) for i in range(num_buckets)]

    def add(self, bucket: Hashable, item: Any) -> list[Any] | None:
        """Put ``item`` into ``bucket``; return the bucket's batch if it is now full."""
        items = self.waiting.setdefault(bucket, [])
        items.append(item)
        if len(items) < self.batch_size:
            return None
        # Emptied before returning: a consumer that stops here never comes back for it.
        self.waiting[bucket] = []
        return items

    def rest(self) -> Iterator[list[Any]]:
        """Empty the buckets in bucket order, each non-empty one as a last, smaller batch."""
        for bucket in sorted(self.waiting):
            batch, self.waiting[bucket] = self.waiting[bucket], []
            if batch:
                yield batch


class LazyBucketIds(BucketOf):
    """Each dataset index's aspect-ratio bucket, found when a batch plan first asks, then kept.

    Nothing is read when it is built. A record's bucket comes from its ``width``/``height``,
    else from its image's header (:func:`record_aspect_ratio`), the first time a plan reaches
    the record; it depends only on the record, so every rank, every ``NUM_WORKERS`` and a
    resumed run compose the same batches. The cache lives with the plans, in the training process.

    Memory: one byte per record (bucket + 1; 0: not read yet) in a zero-filled numpy array,
    whose pages the operating system maps only once written: at most 300 MB for 300 million records.

    Cost: a :class:`~trainkit.data.plans.batch_plan.GlobalBatchPlan` runs the whole global
    stream on every rank, so in the first epoch each of the ``W`` ranks reads every record
    once (a few microseconds; a header, about 0.1 ms, for one without a size); later epochs
    read none. Accepted rather than shared: sharing the reads would put a collective, or a
    segment one rank writes and the others wait for, in the planning of every step.
    ``benchmarks/data.py`` measures the read and the first epoch's throughput.
    """

    def __init__(
        self, records: Any, bins: Sequence[float], known: np.ndarray | None = None
    ) -> None:
        """Find the buckets of ``records`` between ``bins`` lazily (``known``: bucket + 1 or 0)."""
        super().__init__(bins)
        if len(self.bins) > 254:
            raise ConfigError(
                f"DATALOADER.ASPECT_RATIO_BINS has {len(self.bins)} boundaries; at most 254 are "
                "supported for records without 'width'/'height'."
            )
        self.records = records
        known = np.zeros(len(records), dtype=np.uint8) if known is None else known
        self._known = np.asarray(known, dtype=np.uint8)

    def __len__(self) -> int:
        return len(self._known)

    def __getitem__(self, index: int) -> int:
        """Return the bucket of dataset index ``index`` (read now if it is not known)."""
        known = int(self._known[index])
        if known:
            return known - 1
        bucket = bisect.bisect_right(self.bins, record_aspect_ratio(self.records[index], index))
        self._known[index] = bucket + 1
        return bucket

    def buckets_of(self, indices: np.ndarray) -> Iterator[int]:
        """Return an iterator over the buckets of ``indices``, reading each when it is reached."""
        known = self._known[indices]
        if known.all():  # the usual case once a stream has passed over the records
            return iter((known.astype(np.int16) - 1).tolist())
        # A generator: a plan that stops at the first full bucket reads no further record.
        return (int(k) - 1 if k else self[i] for i, k in zip(indices.tolist(), known.tolist()))


def record_bucket_ids(records: Any, bins: Sequence[float]) -> LazyBucketIds:
    """Return every dataset index's aspect-ratio bucket, each found when a plan first needs it.

    Only the first record is read now, so that a dataset without sizes and images fails when
    the loader is built, not at step 0; any other record is read (its ``width``/``height``,
    else its image's header) the first time a plan reaches it (:class:`LazyBucketIds`).

    Raises:
        ConfigError: A ``ValueError``: for bad ``bins``, or a first record with a
            non-positive size or neither a size nor a ``file_name``.
    """
    ids = LazyBucketIds(records, bins)
    if len(records) and _stated_aspect_ratio(records[0], 0) is None:
        _file_name(records[0], 0)
    return ids
