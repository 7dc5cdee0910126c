"""Prefetching to a GPU and channels-last on a GPU (marked ``gpu``; skipped without CUDA).

The look-ahead and position bookkeeping are tested on the CPU in
tests/data/test_device_prefetch.py and tests/engine/test_prefetch.py; here the copies are real:
pinned, one per dtype, on a side stream, overlapping with work on the current stream.
"""

from __future__ import annotations

import pytest
import torch

from tests.engine.test_default_trainer import RegressionModel, RegressionTrainer, _cfg
from trainkit.config import get_cfg
from trainkit.data import build_batch_data_loader
from trainkit.data.loading.loader import pack_batch, unpack_batch
from trainkit.data.loading.step_batches import DevicePrefetcher, copy_batch_to_device
from trainkit.data.samplers import TrainingSampler
from trainkit.engine import hooks
from trainkit.modeling import build_model
from trainkit.utils.env import seed_all_rng

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _cuda():
    return torch.device("cuda", torch.cuda.current_device())


def _records(n=4, seed=0, size=24):
    generator = torch.Generator().manual_seed(seed)
    return [
        {
            "image": torch.randint(
                0, 256, (3, size + i, size), generator=generator, dtype=torch.uint8
            ),
            "boxes": torch.rand(i + 1, 4, generator=generator),
            "label": i,
            "file_name": f"{i}.png",
        }
        for i in range(n)
    ]


def _assert_on_gpu_and_equal(moved, batch):
    assert len(moved) == len(batch)
    for got, want in zip(moved, batch):
        assert got.keys() == want.keys()
        for key, value in want.items():
            if isinstance(value, torch.Tensor):
                assert got[key].device == _cuda(), key
                assert torch.equal(got[key].cpu(), value), key
            else:
                assert got[key] == value, key


def _storages(tensors):
    return {t.untyped_storage().data_ptr() for t in tensors}


def test_a_nested_batch_arrives_equal_in_one_copy_per_dtype():
    batch = _records()
    moved, copies = copy_batch_to_device(batch, _cuda())
    assert sorted(str(c.dtype) for c in copies) == ["torch.float32", "torch.uint8"]
    assert _storages(r[k] for r in moved for k in ("image", "boxes")) == _storages(copies)
    _assert_on_gpu_and_equal(moved, batch)


def test_a_pinned_packed_batch_is_copied_buffer_by_buffer_without_a_host_copy():
    packed = pack_batch(_records()).pin_memory()
    views = unpack_batch(packed)
    assert all(r["image"].is_pinned() and r["boxes"].is_pinned() for r in views)
    moved, copies = copy_batch_to_device(views, _cuda())
    assert len(copies) == len(packed.buffers) == 2
    assert _storages(r[k] for r in moved for k in ("image", "boxes")) == _storages(copies)
    _assert_on_gpu_and_equal(moved, _records())
    moved, copies = copy_batch_to_device(packed, _cuda())  # the PackedBatch itself
    assert len(copies) == 2
    _assert_on_gpu_and_equal(moved, _records())


def _mapper(index):
    return _records(1, seed=index)[0]


def test_a_pinning_loader_with_workers_gives_batches_of_one_copy_per_dtype():
    def loader(pin):
        return build_batch_data_loader(
            list(range(32)),
            TrainingSampler(32, seed=1),
            4,
            mapper=_mapper,
            num_workers=1,
            pin_memory=pin,
            seed=1,
        )

    expected = [b for _, b in zip(range(5), loader(False))]
    pinned = loader(True)
    prefetcher = DevicePrefetcher(iter(pinned), _cuda(), loader=pinned)
    for want in expected[:4]:
        _assert_on_gpu_and_equal(next(prefetcher), want)
    prefetcher.close()
    batch = next(iter(pinned))  # the loader was put back after the 4 batches handed out
    assert all(torch.equal(g["image"], w["image"]) for g, w in zip(batch, expected[4]))
    assert batch[0]["image"].is_pinned()
    assert len(copy_batch_to_device(batch, _cuda())[1]) == 2


def test_copies_overlapping_with_the_step_do_not_corrupt_batches():
    # Each batch is read only after long work queued on the current stream, and then
    # dropped while that work still runs; the next copies (on the side stream) must not
    # land in its memory before the read (record_stream), nor be read before they end
    # (wait_stream).
    batches = [_records(4, seed=s, size=96) for s in range(24)]
    prefetcher = DevicePrefetcher(iter(batches), _cuda(), depth=2)
    x = torch.randn(1024, 1024, device=_cuda())
    sums = []
    for batch in prefetcher:
        for _ in range(4):
            x = torch.tanh(x @ x)
        sums.append(torch.stack([r["image"].float().sum() + r["boxes"].sum() for r in batch]))
        del batch
    got = torch.stack(sums).cpu()
    want = torch.stack(
        [torch.stack([r["image"].float().sum() + r["boxes"].sum() for r in b]) for b in batches]
    )
    torch.testing.assert_close(got, want)


def test_prefetching_pinned_batches_never_waits_for_the_device():
    batches = [unpack_batch(pack_batch(_records(seed=s)).pin_memory()) for s in range(4)]
    unpinned = [_records(seed=s) for s in range(4)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for source in (batches, unpinned):
            for batch in DevicePrefetcher(iter(source), _cuda()):
                batch[0]["image"].float().sum()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.fixture
def no_tf32():
    # TF32 convolutions round differently for each layout; compare at float32 precision.
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = saved


def test_a_channels_last_model_matches_the_contiguous_one(no_tf32):
    def build(channels_last):
        cfg = get_cfg()
        cfg.MODEL.DEVICE = "cuda"
        cfg.MODEL.NUM_CLASSES = 4
        cfg.MODEL.CLASSIFIER.CHANNELS = [8, 16, 16]
        cfg.MODEL.CHANNELS_LAST = channels_last
        return build_model(cfg)

    torch.manual_seed(0)
    plain, nhwc = build(False), build(True)
    nhwc.load_state_dict(plain.state_dict())
    batch = _records(4, size=40)
    losses = []
    for model in (plain, nhwc):
        loss = model(batch)["loss_cls"]
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-5)
    grads = dict(plain.named_parameters())
    for name, param in nhwc.named_parameters():
        torch.testing.assert_close(param.grad, grads[name].grad, rtol=1e-4, atol=1e-5)
    conv = nhwc.stages[0].convs[0]
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    x, _ = nhwc.preprocess_image(batch)
    assert conv(x).is_contiguous(memory_format=torch.channels_last)


class _GpuRegressionModel(RegressionModel):
    def forward(self, batch):
        # Without prefetching the batch comes on the CPU (a no-op with it).
        device = self.out.weight.device
        return super().forward([{k: v.to(device) for k, v in b.items()} for b in batch])


class _GpuRegressionTrainer(RegressionTrainer):
    @classmethod
    def build_model(cls, cfg):
        return _GpuRegressionModel().to(cfg.MODEL.DEVICE)


class _StopAfter(hooks.CallbackHook):
    def __init__(self, k, seen):
        def after_step(trainer):
            if trainer.iter == k:
                seen["loader"] = trainer.data_loader.state_dict()
                seen["consumed"] = trainer._trainer.loader_state_dict()
                raise KeyboardInterrupt

        super().__init__(after_step=after_step)


def _train(output_dir, *, resume=False, stop_after=None, prefetch=True):
    seed_all_rng(7)
    cfg = _cfg(output_dir, max_iter=8, workers=1)
    cfg.MODEL.DEVICE = "cuda"
    cfg.TEST.EVAL_PERIOD = 0  # the test loader's batches stay on the CPU
    cfg.DATASETS.TEST = ()
    cfg.DATALOADER.PIN_MEMORY = True
    cfg.DATALOADER.PREFETCH_TO_DEVICE = prefetch
    trainer = _GpuRegressionTrainer(cfg)
    assert trainer._trainer.batches.prefetch_device == (_cuda() if prefetch else None)
    seen = {}
    if stop_after is not None:
        trainer.register_hooks([_StopAfter(stop_after, seen)])
    trainer.resume_or_load(resume=resume)
    try:
        trainer.train()
    except KeyboardInterrupt:
        pass
    model = trainer.checkpointer.model
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, seen


def test_resume_is_exact_with_prefetching_on(tmp_path):
    straight, _ = _train(tmp_path / "straight")
    plain, _ = _train(tmp_path / "plain", prefetch=False)
    for name, value in straight.items():
        assert torch.equal(value, plain[name]), name  # prefetching changes no batch
    _, seen = _train(tmp_path / "resumed", stop_after=4)
    assert seen["loader"] != seen["consumed"]  # a batch was in flight at the checkpoint
    resumed, _ = _train(tmp_path / "resumed", resume=True)
    for name, value in straight.items():
        assert torch.equal(value, resumed[name]), name
