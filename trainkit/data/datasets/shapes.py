"""The built-in ``shapes`` dataset: synthetic images generated on first use, no download.

Layout under the datasets root (:func:`get_datasets_root`)::

    shapes/
      train/manifest.json  train/000000.png ...
      val/manifest.json    val/000000.png ...
      .train.lock .val.lock

A split directory is complete exactly when it holds ``manifest.json``: generation writes a temporary
sibling directory, the manifest (with every record) last, then renames it into place, so an
interrupted run never leaves a split that looks complete. A file lock serialises generation between
processes (the ranks of a job): one generates, the others wait and then read its manifest.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from trainkit.data.catalog import DatasetCatalog, MetadataCatalog
from trainkit.data.datasets._shapes_render import (
    RENDER_VERSION,
    SHAPES_CLASSES,
    render_shape_image,
)

logger = logging.getLogger(__name__)

__all__ = [
    "DATASETS_ENV_VAR",
    "SHAPES_CLASSES",
    "SHAPES_SPLITS",
    "get_datasets_root",
    "load_shapes",
    "register_shapes",
]

DATASETS_ENV_VAR = "TRAINKIT_DATASETS"
MANIFEST_NAME = "manifest.json"

# split -> (number of images, seed). Train and val seeds differ, so no image is in both.
SHAPES_SPLITS: dict[str, tuple[int, int]] = {"train": (5000, 0), "val": (1000, 1)}

# Below this many images the start-up of worker processes costs more than it saves.
_MIN_IMAGES_FOR_POOL = 1000
_CHUNK_SIZE = 100


def get_datasets_root() -> str:
    """Return the directory holding built-in datasets.

    ``$TRAINKIT_DATASETS`` if set; otherwise ``datasets/`` of the source checkout when trainkit is
    installed editable (or run from the checkout); otherwise ``~/.trainkit/datasets``. It is
    resolved on every call, so setting the variable after import takes effect.
    """
    from_env = os.environ.get(DATASETS_ENV_VAR)
    if from_env:
        return os.path.abspath(os.path.expanduser(from_env))
    # trainkit/data/datasets/shapes.py -> the directory holding the trainkit package.
    checkout = Path(__file__).resolve().parents[3]
    if (checkout / "setup.py").is_file() or (checkout / ".git").exists():
        return str(checkout / "datasets")
    return os.path.join(os.path.expanduser("~"), ".trainkit", "datasets")


def _read_manifest(split_dir: str, expected: Mapping[str, Any]) -> list[dict] | None:
    """Return the stored records if ``split_dir`` is complete and matches ``expected``."""
    path = os.path.join(split_dir, MANIFEST_NAME)
    try:
        with open(path) as f:
            manifest = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        logger.warning("Ignoring unreadable %s (%s); the split will be regenerated.", path, e)
        return None
    header = {k: manifest.get(k) for k in expected}
    if header != dict(expected):
        logger.warning(
            "%s was made with %s, but %s is wanted; regenerating it.", path, header, dict(expected)
        )
        return None
    return manifest["records"]


@contextlib.contextmanager
def _file_lock(lock_path: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_path`` (created if missing) inside the block."""
    with open(lock_path, "a+") as lock_file:  # closing it releases the lock
        try:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("Waiting for another process to finish generating (lock %s) ...", lock_path)
            started = time.monotonic()
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
            logger.info("Lock %s acquired after %.1f s.", lock_path, time.monotonic() - started)
        yield


def _render_and_save(job: tuple[str, int, list[int]]) -> list[dict[str, Any]]:
    """Render images ``indices`` of a split into ``out_dir``; return their records.

    Module-level so that worker processes can unpickle it.
    """
    out_dir, seed, indices = job
    records = []
    for index in indices:
        label = index % len(SHAPES_CLASSES)  # balanced classes
        image = render_shape_image(seed, index, label)
        file_name = f"{index:06d}.png"
        # compress_level=1: the noise makes PNG barely compressible, and level 6 is slower.
        image.save(os.path.join(out_dir, file_name), format="PNG", compress_level=1)
        size = {"height": image.height, "width": image.width}
        records.append({"file_name": file_name, **size, "label": label, "image_id": index})
    return records


def _render_all(
    out_dir: str, header: Mapping[str, Any], num_workers: int, show_progress: bool
) -> list[dict[str, Any]]:
    num_images = header["num_images"]
    jobs = [
        (out_dir, header["seed"], list(range(start, min(start + _CHUNK_SIZE, num_images))))
        for start in range(0, num_images, _CHUNK_SIZE)
    ]
    from tqdm import tqdm  # imported here: only generating the dataset shows progress

    records: list[dict[str, Any]] = []
    desc = f"Generating shapes/{header['split']}"
    with contextlib.ExitStack() as stack:
        bar = stack.enter_context(
            tqdm(total=num_images, desc=desc, unit="img", disable=not show_progress)
        )
        chunks = map(_render_and_save, jobs)
        if num_workers > 1 and num_images >= _MIN_IMAGES_FOR_POOL:
            # "spawn": forking a process that runs training threads (gloo, OpenMP) can
            # deadlock the children; spawn costs an import of trainkit per worker instead.
            pool = stack.enter_context(multiprocessing.get_context("spawn").Pool(num_workers))
            chunks = pool.imap(_render_and_save, jobs)
        for chunk in chunks:
            records.extend(chunk)
            bar.update(len(chunk))
    return records


def _generate_split(
    split_dir: str, header: Mapping[str, Any], num_workers: int, show_progress: bool
) -> list[dict]:
    """Generate a split into a temporary directory and rename it to ``split_dir``."""
    parent, prefix = os.path.dirname(split_dir), f".{os.path.basename(split_dir)}."
    tmp_dir = tempfile.mkdtemp(prefix=prefix, suffix=".tmp", dir=parent)
    stale = None
    try:
        os.chmod(tmp_dir, 0o755)  # mkdtemp makes it private; the dataset is for everyone
        started = time.monotonic()
        records = _render_all(tmp_dir, header, num_workers, show_progress)
        # The manifest is written last: its presence is what marks the split complete.
        with open(os.path.join(tmp_dir, MANIFEST_NAME), "w") as f:
            json.dump({**header, "records": records}, f)
            f.flush()
            os.fsync(f.fileno())
        if os.path.exists(split_dir):
            # An outdated or incomplete split: move it aside first, since a directory can
            # only be renamed onto an empty one.
            stale = tempfile.mkdtemp(prefix=prefix, suffix=".old", dir=parent)
            os.replace(split_dir, os.path.join(stale, "split"))
        os.replace(tmp_dir, split_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    if stale is not None:
        shutil.rmtree(stale, ignore_errors=True)
    logger.info(
        "Generated %d shapes/%s images in %s (%.1f s).",
        *(len(records), header["split"], split_dir, time.monotonic() - started),
    )
    return records


def load_shapes(
    split: str,
    num_images: int,
    seed: int,
    root: str | None = None,
    *,
    num_workers: int = 2,
    show_progress: bool = True,
) -> list[dict]:
    """Return the records of a ``shapes`` split, generating its images first if needed.

    Args:
        split: directory name of the split under ``<root>/shapes`` (e.g. ``"train"``).
        num_images, seed: the split's size and seed (image ``i`` depends only on ``(seed, i)``).
        root: datasets root; ``None`` means :func:`get_datasets_root`.
        num_workers: processes that render images (1 renders in this process).
        show_progress: show a tqdm progress bar while generating.

    Returns:
        One dict per image with ``file_name`` (absolute path), ``height``, ``width``,
        ``label`` (index into ``SHAPES_CLASSES``) and ``image_id``.

    Raises:
        ValueError: If ``num_images`` is not positive.
        OSError: If the datasets root cannot be created or written; set
            ``$TRAINKIT_DATASETS`` to a writable directory.
    """
    if num_images < 1:
        raise ValueError(f"shapes/{split}: num_images must be >= 1, got {num_images}")
    shapes_dir = os.path.join(root if root is not None else get_datasets_root(), "shapes")
    split_dir = os.path.join(shapes_dir, split)
    header = {"dataset": "shapes", "split": split, "num_images": num_images, "seed": seed}
    header.update(render_version=RENDER_VERSION, thing_classes=list(SHAPES_CLASSES))
    records = _read_manifest(split_dir, header)  # fast path: no lock once generated
    if records is None:
        try:
            os.makedirs(shapes_dir, exist_ok=True)
        except OSError as e:
            raise OSError(
                f"cannot create the shapes dataset directory {shapes_dir} ({e}); set "
                f"{DATASETS_ENV_VAR} to a writable directory."
            ) from e
        with _file_lock(os.path.join(shapes_dir, f".{split}.lock")):
            # Another process may have generated it while this one waited for the lock.
            records = _read_manifest(split_dir, header)
            if records is None:
                records = _generate_split(split_dir, header, num_workers, show_progress)
    return [{**r, "file_name": os.path.join(split_dir, r["file_name"])} for r in records]


def register_shapes(
    root: str | None = None,
    *,
    name_prefix: str = "shapes",
    splits: Mapping[str, tuple[int, int]] | None = None,
) -> None:
    """Register the ``shapes`` splits in ``DatasetCatalog`` and set their metadata.

    Registration is cheap: images are generated on the first ``DatasetCatalog.get``.

    Args:
        root: datasets root; ``None`` resolves :func:`get_datasets_root` at each ``get``.
        name_prefix: dataset names are ``f"{name_prefix}_{split}"``.
        splits: split name -> (number of images, seed); defaults to :data:`SHAPES_SPLITS`.

    Raises:
        ValueError: If one of the names is already registered.
    """
    for split, (num_images, seed) in (splits if splits is not None else SHAPES_SPLITS).items():
        name = f"{name_prefix}_{split}"

        def _load(split: str = split, num_images: int = num_images, seed: int = seed) -> list[dict]:
            return load_shapes(split, num_images, seed, root)

        DatasetCatalog.register(name, _load)
        MetadataCatalog.get(name).set(
            thing_classes=list(SHAPES_CLASSES), evaluator_type="classification"
        )
