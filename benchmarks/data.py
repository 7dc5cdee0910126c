"""``data``: train loader throughput and padding, against plain torch DataLoaders.

* map-style: ``build_train_loader`` on ``shapes_train`` (grouping on and off, 0 and 2 workers)
  beside a torch ``DataLoader`` + ``DistributedSampler`` on the same records and mapper work;
  and grouping on over the same records without ``width``/``height`` (as ``load_sem_seg``
  gives them): each image's header is read when the batch plan first reaches it, so the
  measured window (a new loader: the first pass) pays one header read per record;
* what grouping costs when the loader is built (the first record's size: the others are
  read when the plan reaches them) and per record as the plan reaches it;
* a stream: ``build_batch_data_loader(MapDataset(stream, mapper), None, ...)`` with 2 workers
  (trainkit shards the stream across its workers and maps whole batches) beside a torch
  ``DataLoader`` over an ``IterableDataset`` that shards itself with ``get_worker_info()`` and
  maps each batch;
* padding per batch and the classifier's step time with each way of batching;
* mixing three sets by weight (``DATASETS.TRAIN_WEIGHTS``, :mod:`benchmarks.mixing`): the
  plan composing mixed steps beside plain ones, and the padding grouping then costs.

Each throughput row also shows the CPU time per sample (main process and workers): on a
shared machine it moves far less than samples/s.

Private use: the baselines' mapper overrides ``ClassificationDatasetMapper._augment``, the
one method that draws from ``sample_rng()``, to draw from a fixed-seed generator instead
(a plain torch loader has no sample context); everything else is the built-in mapper's work.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import time
from typing import Any

import numpy as np
from PIL import Image
from torch.utils.data import (
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    get_worker_info,
)

from benchmarks.measure import alternate, cpu_seconds, median
from benchmarks.mixing import bench_mixing
from benchmarks.padding import bench_padding
from benchmarks.report import print_table, target_text, verdict
from benchmarks.shapes import shapes_cfg, train_loader
from trainkit.data import (
    DatasetCatalog,
    DatasetFromList,
    MapDataset,
    build_batch_data_loader,
    build_train_loader,
    trivial_batch_collator,
)
from trainkit.data.mapping.mappers import ClassificationDatasetMapper
from trainkit.data.plans.grouping import LazyBucketIds, record_bucket_ids

_MAP_STYLE_TARGET = 1.0  # grouping on vs the torch loader
_STREAM_TARGET = 0.95  # the stream through build_batch_data_loader vs a self-sharding one
_BUILD_MS_TARGET = 1.0  # grouping's cost when a loader is built: the first record read
# Images per batch in the throughput rows (the comparison: batch 8, as a GPU job's
# per-process batch often is); the padding rows keep benchmarks.shapes.BATCH.
LOADER_BATCH = 8


class _SeededMapper(ClassificationDatasetMapper):
    """The built-in mapper with one fixed-seed numpy generator instead of ``sample_rng()``.

    Same work per image (read, cap, random rescale, random flip); usable in any loader.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rng = np.random.default_rng(0)

    def _augment(self, image: Image.Image) -> Image.Image:
        low, high = self.scale_range
        cap_size = getattr(self, "max_size_train", 0)
        longest = max(image.width, image.height)
        cap = cap_size / longest if cap_size and longest > cap_size else 1.0
        do_flip = self._rng.random() < self.flip_prob
        scale = cap * self._rng.uniform(low, high)
        if scale != 1.0:
            size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
            image = image.resize(size, Image.Resampling.BILINEAR)
        if do_flip:
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return image


class _Mapped(Dataset):
    def __init__(self, records: list[dict[str, Any]], mapper: Any) -> None:
        self.records, self.mapper = records, mapper

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, idx: int) -> Any:
        return self.mapper(self.records[idx])


def _torch_loader(num_workers: int) -> Any:
    cfg = shapes_cfg(LOADER_BATCH, num_workers)
    dataset = _Mapped(DatasetCatalog.get("shapes_train"), _SeededMapper(cfg, is_train=True))
    extra = {"multiprocessing_context": "fork", "prefetch_factor": 2} if num_workers else {}
    return DataLoader(
        dataset,
        batch_size=LOADER_BATCH,
        num_workers=num_workers,
        drop_last=True,
        sampler=DistributedSampler(dataset, num_replicas=1, rank=0, seed=0),
        collate_fn=trivial_batch_collator,
        **extra,
    )


class _ShapesStream(IterableDataset):
    """The ``shapes_train`` records as an endless stream, epoch after epoch in file order."""

    def __init__(self, records: list[dict[str, Any]]) -> None:
        self.records = records

    def __iter__(self) -> Any:
        while True:
            yield from self.records


class _ShardedBatches(IterableDataset):
    """The baseline stream loader: each worker reads every n-th element, maps whole batches."""

    def __init__(self, stream: IterableDataset, mapper: Any, batch_size: int) -> None:
        self.stream, self.mapper, self.batch_size = stream, mapper, batch_size

    def __iter__(self) -> Any:
        info = get_worker_info()
        worker, num_workers = (info.id, info.num_workers) if info else (0, 1)
        elements = itertools.islice(iter(self.stream), worker, None, num_workers)
        while True:
            chunk = list(itertools.islice(elements, self.batch_size))
            if len(chunk) < self.batch_size:
                return
            mapped = [self.mapper(record) for record in chunk]
            yield trivial_batch_collator([s for s in mapped if s is not None])


def _trainkit_stream_loader(num_workers: int) -> Any:
    cfg = shapes_cfg(LOADER_BATCH, num_workers)
    stream = _ShapesStream(DatasetCatalog.get("shapes_train"))
    mapper = ClassificationDatasetMapper(cfg, is_train=True)
    return build_batch_data_loader(
        MapDataset(stream, mapper), None, LOADER_BATCH, num_workers=num_workers
    )


def _unsized_records() -> list[dict[str, Any]]:
    """The ``shapes_train`` records without ``width``/``height`` (as ``load_sem_seg``'s)."""
    sizes = ("width", "height")
    return [
        {k: v for k, v in r.items() if k not in sizes} for r in DatasetCatalog.get("shapes_train")
    ]


def _unsized_loader(num_workers: int, records: list[dict[str, Any]]) -> Any:
    """``build_train_loader`` with grouping over ``records`` (no sizes: read from headers)."""
    cfg = shapes_cfg(LOADER_BATCH, num_workers)
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = True
    mapper = ClassificationDatasetMapper(cfg, is_train=True)
    return build_train_loader(cfg, mapper, dataset=records)


def _torch_stream_loader(num_workers: int) -> Any:
    cfg = shapes_cfg(LOADER_BATCH, num_workers)
    stream = _ShapesStream(DatasetCatalog.get("shapes_train"))
    batches = _ShardedBatches(stream, _SeededMapper(cfg, is_train=True), LOADER_BATCH)
    extra = {"multiprocessing_context": "fork", "prefetch_factor": 2} if num_workers else {}
    return DataLoader(batches, batch_size=None, num_workers=num_workers, **extra)


def _throughput(make: Any, batches: int, cpu_us: list[float], warmup: int = 10) -> float:
    """Samples/s over ``batches`` batches after ``warmup`` ones (worker start-up excluded).

    A short window right after start-up mostly measures how fast the workers fill their
    prefetch queues, which is why the first batches are skipped. Appends to ``cpu_us`` the
    CPU time per sample of the iteration (main process and workers, warm-up included; the
    loader's construction is not): unlike samples/s, it hardly moves when other jobs share
    the machine.
    """
    loader = make()
    began = cpu_seconds()
    it = iter(loader)
    for _ in range(warmup):
        next(it)
    start = time.perf_counter()
    for batch in itertools.islice(it, batches):
        assert len(batch) == LOADER_BATCH
    rate = batches * LOADER_BATCH / (time.perf_counter() - start)
    del it  # shuts the workers down (and reaps them: their CPU time is counted now)
    gc.collect()
    cpu_us.append((cpu_seconds() - began) / ((warmup + batches) * LOADER_BATCH) * 1e6)
    return rate


def bench_data(args: argparse.Namespace) -> dict[str, Any]:
    """Loader samples/s (map-style at 0 and 2 workers, a stream at 2); padding, step time."""
    quick = args.quick
    # Throughput on a shared 2-core machine moves by +-5 % run to run; 5 rounds of 150
    # batches keep the median steadier than the 3 x 100 used before.
    rounds = 1 if quick else 5
    num_batches = 4 if quick else 300
    results: dict[str, Any] = {
        "throughput": _bench_map_style(rounds, num_batches),
        "stream": _bench_stream(rounds, num_batches),
        "grouping_sizes": _bench_grouping_sizes(rounds),
    }
    results.update(bench_padding(quick, rounds))
    results["mixing"] = bench_mixing(quick, rounds)
    return results


def _bench_map_style(rounds: int, num_batches: int) -> list[dict[str, Any]]:
    results, rows = [], []
    unsized = _unsized_records()
    for workers in (0, 2):
        makers = {
            "grouping on": lambda w=workers: train_loader(w, True, batch_size=LOADER_BATCH),
            _UNSIZED: lambda w=workers: _unsized_loader(w, unsized),
            "grouping off": lambda w=workers: train_loader(w, False, batch_size=LOADER_BATCH),
            "torch": lambda w=workers: _torch_loader(w),
        }
        cpu: dict[str, list[float]] = {name: [] for name in makers}
        samples = alternate(
            {
                name: lambda m=make, c=cpu[name]: _throughput(m, num_batches, c)
                for name, make in makers.items()
            },
            rounds,
        )
        med = {k: median(v) for k, v in samples.items()}
        cpu_med = {k: median(v) for k, v in cpu.items()}
        for kind in ("grouping on", _UNSIZED, "grouping off"):
            ratio = med[kind] / med["torch"]
            judged = kind == "grouping on"
            v = verdict(ratio, _MAP_STYLE_TARGET, higher_is_better=True) if judged else ""
            results.append(
                {
                    "workers": workers,
                    "kind": kind,
                    "samples": samples[kind],
                    "rate": med[kind],
                    "torch_rate": med["torch"],
                    "ratio": ratio,
                    "cpu_us": cpu_med[kind],
                    "torch_cpu_us": cpu_med["torch"],
                    "verdict": v or None,
                }
            )
            target = target_text(_MAP_STYLE_TARGET, higher_is_better=True) if judged else ""
            rows.append(
                [
                    f"build_train_loader, {kind}",
                    workers,
                    med[kind],
                    med["torch"],
                    ratio,
                    cpu_med[kind],
                    cpu_med["torch"],
                    target,
                    v,
                ]
            )
    print_table(
        "Train loader throughput on shapes_train (ClassificationDatasetMapper, batch "
        f"{LOADER_BATCH}, {num_batches} batches after 10 warm-up batches; medians of {rounds} "
        "alternating runs) vs torch DataLoader + DistributedSampler(num_replicas=1) with a "
        f"fixed-seed mapper; '{_UNSIZED}': the same records without width/height, each "
        "image's header read when the plan first reaches it (a new loader each run: every "
        "record in the window is read cold); CPU: main process and workers, per sample",
        _COLUMNS,
        rows,
    )
    return results


_UNSIZED = "grouping on, no width/height"

_COLUMNS = [
    "loader",
    "workers",
    "samples/s",
    "torch samples/s",
    "ratio",
    "CPU us/sample",
    "torch CPU us/sample",
    "target",
    "PASS/MISS",
]


def _bench_stream(rounds: int, num_batches: int) -> dict[str, Any]:
    workers = 2
    makers = {
        "trainkit": lambda: _trainkit_stream_loader(workers),
        "torch": lambda: _torch_stream_loader(workers),
    }
    cpu: dict[str, list[float]] = {name: [] for name in makers}
    samples = alternate(
        {
            name: lambda m=make, c=cpu[name]: _throughput(m, num_batches, c)
            for name, make in makers.items()
        },
        rounds,
    )
    tk, base = median(samples["trainkit"]), median(samples["torch"])
    ratio = tk / base
    result = {
        "workers": workers,
        "samples": samples,
        "rate": tk,
        "torch_rate": base,
        "ratio": ratio,
        "cpu_us": median(cpu["trainkit"]),
        "torch_cpu_us": median(cpu["torch"]),
        "target": _STREAM_TARGET,
        "verdict": verdict(ratio, _STREAM_TARGET, higher_is_better=True),
    }
    print_table(
        f"A stream of the shapes_train records through build_batch_data_loader(MapDataset("
        f"stream, mapper), None, {LOADER_BATCH}, num_workers={workers}) vs a torch DataLoader "
        "over an IterableDataset that shards itself with get_worker_info() and maps each batch "
        f"(fixed-seed mapper); {num_batches} batches after 10 warm-up batches, medians of "
        f"{rounds} alternating runs",
        _COLUMNS,
        [
            [
                "build_batch_data_loader, stream",
                workers,
                tk,
                base,
                ratio,
                result["cpu_us"],
                result["torch_cpu_us"],
                target_text(_STREAM_TARGET, higher_is_better=True),
                result["verdict"],
            ]
        ],
    )
    return result


def _bench_grouping_sizes(rounds: int) -> dict[str, Any]:
    """Grouping's cost when the loader is built, and per record as the plan reaches it.

    Building reads the first record only (``record_bucket_ids``); every other record is read
    the first time the plan reaches it (:class:`~trainkit.data.plans.grouping.LazyBucketIds`): its
    size, or without one its image's header (a file open and a parse).
    """
    # As the loader holds them: one serialised copy, each record unpickled when read.
    sized = DatasetFromList(DatasetCatalog.get("shapes_train"), copy=False)
    unsized = DatasetFromList(_unsized_records(), copy=False)
    bins = shapes_cfg().DATALOADER.ASPECT_RATIO_BINS

    def build_ms(records: DatasetFromList) -> float:
        start = time.perf_counter()
        record_bucket_ids(records, bins)
        return (time.perf_counter() - start) * 1e3

    def read_us(records: DatasetFromList) -> float:
        ids = LazyBucketIds(records, bins)
        start = time.perf_counter()
        for i in range(len(records)):
            ids[i]
        return (time.perf_counter() - start) / len(records) * 1e6

    samples = alternate(
        {
            "sized_build_ms": lambda: build_ms(sized),
            "unsized_build_ms": lambda: build_ms(unsized),
            "sized_read_us": lambda: read_us(sized),
            "header_read_us": lambda: read_us(unsized),
        },
        rounds,
    )
    result: dict[str, Any] = {k: median(v) for k, v in samples.items()}
    result["records"] = len(sized)
    # Building reads one record, with or without sizes: well under a millisecond, however
    # many records there are.
    slowest_ms = max(result["sized_build_ms"], result["unsized_build_ms"])
    result["verdict"] = verdict(slowest_ms, _BUILD_MS_TARGET, higher_is_better=False)
    target = target_text(_BUILD_MS_TARGET, higher_is_better=False) + " ms"
    print_table(
        f"Aspect-ratio buckets of the {len(sized)} shapes_train records: what building the "
        "loader reads (the first record), and finding one record's bucket the first time the "
        "plan reaches it "
        f"(medians of {rounds} alternating runs; image files in the page cache)",
        ["records", "build, ms", "first reach, us/record", "target", "PASS/MISS"],
        [
            ["with width/height", result["sized_build_ms"], result["sized_read_us"], "", ""],
            [
                "without (image headers)",
                result["unsized_build_ms"],
                result["header_read_us"],
                target,
                result["verdict"],
            ],
        ],
    )
    return result
