"""Augmented batches, and a mapper's own np.random / random draws, are the same for any
NUM_WORKERS and after a resume: both are keyed by the sample's global stream position."""

import io
import itertools
import random

import numpy as np
import pytest
import torch

from trainkit.config import get_cfg
from trainkit.data import build_train_loader
from trainkit.data import transforms as T

RECORDS = [{"id": i, "width": 12 + i % 5, "height": 10} for i in range(40)]
AUGS = T.AugmentationList(
    [
        T.ResizeShortestEdge((6, 12), max_size=20),
        T.RandomFlip(),
        T.RandomCrop("relative_range", (0.5, 0.5)),
        T.RandomBrightness(0.5, 1.5),
    ]
)


def augmenting_mapper(record):
    rows = np.arange(record["height"], dtype=np.uint8)[:, None]
    image = (rows * 7 + np.arange(record["width"], dtype=np.uint8)[None, :] + record["id"]) % 255
    aug_input = T.AugInput(np.stack([image] * 3, axis=-1).astype(np.uint8))
    AUGS(aug_input)
    return record["id"], aug_input.image.shape, aug_input.image.tobytes()


def global_rng_mapper(record):
    return record["id"], float(np.random.rand()), random.random(), int(np.random.randint(1000))


def make_cfg(num_workers):
    cfg = get_cfg()
    cfg.SEED = 7
    cfg.SOLVER.IMS_PER_BATCH = 4
    cfg.DATALOADER.NUM_WORKERS = num_workers
    cfg.DATALOADER.ASPECT_RATIO_GROUPING = False
    return cfg


def take(loader, n):
    return list(itertools.islice(iter(loader), n))


def roundtrip(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


@pytest.mark.parametrize(
    "mapper", [augmenting_mapper, global_rng_mapper], ids=["augs", "np-random"]
)
def test_same_batches_for_any_num_workers_and_after_resume(mapper):
    reference = take(build_train_loader(make_cfg(0), mapper, dataset=RECORDS), 12)
    assert take(build_train_loader(make_cfg(2), mapper, dataset=RECORDS), 12) == reference

    loader = build_train_loader(make_cfg(2), mapper, dataset=RECORDS)
    take(loader, 5)
    state = roundtrip(loader.state_dict())
    resumed = build_train_loader(make_cfg(0), mapper, dataset=RECORDS)
    resumed.load_state_dict(state)
    assert take(resumed, 7) == reference[5:]

    # The draws are random: they differ between samples, also for a record drawn again at
    # another position (48 samples of 40 records).
    samples = [sample for batch in reference for sample in batch]
    assert len({sample[1:] for sample in samples}) > len(samples) * 0.8


def test_global_generators_are_seeded_by_position_not_by_process_state():
    np.random.seed(123)
    random.seed(123)
    first = take(build_train_loader(make_cfg(0), global_rng_mapper, dataset=RECORDS), 3)
    np.random.seed(999)  # the training process's own state does not leak into the samples
    random.seed(999)
    assert take(build_train_loader(make_cfg(0), global_rng_mapper, dataset=RECORDS), 3) == first
