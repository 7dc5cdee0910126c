"""A worker's batch crosses to the training process in one buffer per dtype, rebuilt exactly."""

import pickle

import pytest
import torch

from trainkit.data import MapDataset, build_batch_data_loader, build_test_loader
from trainkit.data.loading.loader import PackedBatch, pack_batch, unpack_batch
from trainkit.data.samplers import TrainingSampler


def _image_mapper(record):
    # detectron2-style samples: a dict with an image tensor of its own size, and plain values
    size = 4 + record % 5
    return {
        "image": torch.full((3, size, size + 1), record % 256, dtype=torch.uint8),
        "mask": torch.arange(size, dtype=torch.float32) * record,
        "label": record % 3,
        "file_name": f"img{record}.png",
    }


def _assert_same_batch(a, b):
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same_batch(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            _assert_same_batch(a[key], b[key])
    else:
        assert a == b


def _storages(batch):
    return {s["image"].untyped_storage().data_ptr() for s in batch}


def test_a_packed_batch_unpacks_to_equal_tensors_in_one_buffer_per_dtype():
    batch = [_image_mapper(r) for r in range(6)] + [(torch.zeros(0), {"k": torch.ones(2, 2)})]
    packed = pack_batch(batch)
    assert isinstance(packed, PackedBatch)
    assert sorted(str(b.dtype) for b in packed.buffers) == ["torch.float32", "torch.uint8"]
    # what a worker sends and the training process receives
    rebuilt = unpack_batch(pickle.loads(pickle.dumps(packed)))
    _assert_same_batch(rebuilt, batch)
    assert len(_storages(rebuilt[:6])) == 1  # every image a view of the one uint8 buffer
    # the views are independent where the tensors were: writing one leaves the others
    rebuilt[0]["image"].fill_(255)
    assert torch.equal(rebuilt[1]["image"], batch[1]["image"])


@pytest.mark.parametrize(
    "batch",
    [
        [torch.ones(3)],  # one tensor: nothing to gain
        [torch.ones(4, 4).t(), torch.ones(4, 4).t()],  # not contiguous
        [torch.ones(3, requires_grad=True), torch.ones(3, requires_grad=True)],
        [torch.arange(8)[2:5], torch.arange(8)[5:]],  # views of a larger storage
        [torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))],  # subclass
        {"odd": {1, 2}, "n": 3},  # no tensor at all
    ],
)
def test_what_cannot_be_rebuilt_exactly_travels_as_it_is(batch):
    assert pack_batch(batch) is batch
    assert unpack_batch(batch) is batch


def test_tensors_that_share_memory_are_not_separated():
    t = torch.ones(3)
    batch = [{"a": t, "b": t}, torch.zeros(2)]
    assert pack_batch(batch) is batch


def _train_batches(num_workers, n=4):
    sampler = TrainingSampler(40, seed=0, rank=0, world_size=1)
    dataset = MapDataset(list(range(40)), _image_mapper)
    loader = build_batch_data_loader(dataset, sampler, 4, num_workers=num_workers)
    it = iter(loader)
    return [next(it) for _ in range(n)]


def test_train_loader_batches_from_workers_equal_those_made_in_process():
    in_process, from_workers = _train_batches(0), _train_batches(2)
    _assert_same_batch(from_workers, in_process)
    # in the training process nothing is copied; from workers, one buffer per batch
    assert all(len(_storages(batch)) == 4 for batch in in_process)
    assert all(len(_storages(batch)) == 1 for batch in from_workers)


def test_stream_batches_from_workers_arrive_packed():
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(16))

    stream = MapDataset(Stream(), _image_mapper)
    batches = list(build_batch_data_loader(stream, None, 4, num_workers=2))
    assert sorted(s["label"] for b in batches for s in b) == sorted(r % 3 for r in range(16))
    assert all(len(_storages(batch)) == 1 for batch in batches)


def test_test_loader_batches_from_workers_equal_those_made_in_process():
    def batches(num_workers):
        loader = build_test_loader(
            list(range(10)), mapper=_image_mapper, batch_size=4, num_workers=num_workers
        )
        return list(loader)

    from_workers = batches(2)
    _assert_same_batch(from_workers, batches(0))
    assert all(len(_storages(batch)) == 1 for batch in from_workers)
