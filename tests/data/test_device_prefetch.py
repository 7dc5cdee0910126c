"""DevicePrefetcher's look-ahead and consumed position, and copy_batch_to_device's grouping (CPU).

The CUDA copies themselves are in tests/gpu/test_prefetch.py.
"""

from __future__ import annotations

import pytest
import torch

from trainkit.data import build_batch_data_loader
from trainkit.data.loading.loader import PackedBatch, pack_batch, unpack_batch
from trainkit.data.loading.step_batches import DevicePrefetcher, copy_batch_to_device
from trainkit.data.samplers import TrainingSampler

_CPU = torch.device("cpu")


class _RecordingCopy:
    """A CPU stand-in for the device copy that logs when each batch starts and finishes."""

    def __init__(self):
        self.log = []

    def start(self, batch):
        self.log.append(("start", batch))
        return batch

    def finish(self, pending):
        self.log.append(("finish", pending))
        return pending


def _loader(n=40, batch=4, seed=3):
    return build_batch_data_loader(
        list(range(n)), TrainingSampler(n, seed=seed), batch, collate_fn=list, seed=seed
    )


@pytest.mark.parametrize("depth", [1, 2])
def test_batches_are_started_depth_ahead_and_handed_out_in_order(depth):
    copy = _RecordingCopy()
    prefetcher = DevicePrefetcher(iter(range(5)), _CPU, depth=depth, batch_copy=copy)
    assert next(prefetcher) == 0
    # The first batch, then the look-ahead started before the consumer gets the first one back.
    started = [b for what, b in copy.log if what == "start"]
    assert started == list(range(depth + 1))
    assert copy.log.index(("finish", 0)) < copy.log.index(("start", depth))
    assert prefetcher.num_in_flight == depth
    assert list(prefetcher) == [1, 2, 3, 4]
    assert [b for what, b in copy.log if what == "finish"] == [0, 1, 2, 3, 4]
    assert prefetcher.num_in_flight == 0


def test_depth_below_one_is_refused():
    with pytest.raises(ValueError, match="at least 1 batch ahead, got depth=0"):
        DevicePrefetcher(iter([]), _CPU, depth=0)


def test_a_loader_error_comes_with_the_batch_that_failed_not_the_one_before():
    def batches():
        yield "a"
        yield "b"
        raise RuntimeError("record 7 is broken")

    prefetcher = DevicePrefetcher(batches(), _CPU)
    assert next(prefetcher) == "a"
    assert next(prefetcher) == "b"  # drawing past it failed; "b" itself is fine
    with pytest.raises(RuntimeError, match="record 7 is broken"):
        next(prefetcher)
    with pytest.raises(StopIteration):
        next(prefetcher)


def test_state_dict_is_the_position_after_the_batches_handed_out():
    loader = _loader()
    prefetcher = DevicePrefetcher(iter(loader), _CPU, loader=loader, depth=2)
    consumed = [next(prefetcher) for _ in range(3)]
    # The loader itself has returned two batches more than the consumer got.
    ahead = loader.state_dict()
    saved = prefetcher.state_dict()
    assert saved != ahead
    resumed = _loader()
    resumed.load_state_dict(saved)
    straight = _loader()
    expected = [b for _, b in zip(range(6), straight)]
    assert consumed == expected[:3]
    assert [b for _, b in zip(range(3), resumed)] == expected[3:]


def test_state_dict_before_any_batch_is_the_loaders_start():
    loader = _loader()
    assert DevicePrefetcher(iter(loader), _CPU, loader=loader).state_dict() == loader.state_dict()


def test_close_puts_the_loader_back_so_the_next_iterator_rereads_the_dropped_batches():
    loader = _loader()
    expected = [b for _, b in zip(range(5), _loader())]
    prefetcher = DevicePrefetcher(iter(loader), _CPU, loader=loader, depth=2)
    assert [next(prefetcher), next(prefetcher)] == expected[:2]
    assert prefetcher.num_in_flight == 2
    prefetcher.close()
    assert [b for _, b in zip(range(3), loader)] == expected[2:]


def test_without_a_position_close_just_drops_the_batches():
    prefetcher = DevicePrefetcher(iter([1, 2, 3]), _CPU, loader=[1, 2, 3])
    assert next(prefetcher) == 1 and prefetcher.state_dict() is None
    prefetcher.close()
    with pytest.raises(StopIteration):
        next(prefetcher)


def _records():
    generator = torch.Generator().manual_seed(0)
    return [
        {
            "image": torch.randint(0, 256, (3, 4 + i, 5), generator=generator, dtype=torch.uint8),
            "boxes": torch.rand(i + 1, 4, generator=generator),
            "label": i,
            "file_name": f"{i}.png",
        }
        for i in range(3)
    ]


def _assert_same_batch(moved, batch):
    assert type(moved) is type(batch) and len(moved) == len(batch)
    for got, want in zip(moved, batch):
        assert got.keys() == want.keys()
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                assert got[key].dtype == value.dtype and torch.equal(got[key], value), key
            else:
                assert got[key] == value, key


def test_separate_tensors_travel_as_one_buffer_per_dtype():
    batch = _records()
    moved, copies = copy_batch_to_device(batch, _CPU, pin_memory=False)
    _assert_same_batch(moved, batch)
    assert sorted(str(c.dtype) for c in copies) == ["torch.float32", "torch.uint8"]
    uint8 = next(c for c in copies if c.dtype == torch.uint8)
    assert all(r["image"].untyped_storage().data_ptr() == uint8.data_ptr() for r in moved)


def test_an_unpacked_packed_batch_travels_as_its_buffers_and_keeps_its_views():
    packed = pack_batch(_records())
    assert type(packed) is PackedBatch and len(packed.buffers) == 2
    views = unpack_batch(packed)
    moved, copies = copy_batch_to_device(views, _CPU, pin_memory=False)
    _assert_same_batch(moved, _records())
    assert len(copies) == 2  # one per buffer, each its whole storage
    for got, want in zip(moved, views):
        for key in ("image", "boxes"):
            assert got[key].storage_offset() == want[key].storage_offset()
            assert got[key].stride() == want[key].stride()


def test_a_packed_batch_is_copied_buffer_by_buffer_and_unpacked():
    packed = pack_batch(_records())
    moved, copies = copy_batch_to_device(packed, _CPU, pin_memory=False)
    _assert_same_batch(moved, _records())
    assert len(copies) == len(packed.buffers)


def test_tensors_that_need_gradients_and_other_leaves_are_left_alone():
    weight = torch.ones(2, requires_grad=True)
    batch = ({"w": weight, "n": 3}, [torch.zeros(0)], "text")
    moved, copies = copy_batch_to_device(batch, _CPU, pin_memory=False)
    assert moved[0]["w"] is weight and moved[0]["n"] == 3 and moved[2] == "text"
    assert type(moved) is tuple and moved[1][0].shape == (0,)
    assert [c.dtype for c in copies] == [torch.float32]
