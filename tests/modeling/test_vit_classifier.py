"""ViTClassifier: outputs, padding invariance, its blocks, config checks, one sharded step."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist

from trainkit.config import ConfigError, get_cfg
from trainkit.modeling import build_model, model_blocks, shard_model
from trainkit.modeling.shape_plan import ShapePlan
from trainkit.modeling.vit_classifier import ViTClassifier


def _cfg(**overrides):
    cfg = get_cfg()
    cfg.MODEL.META_ARCHITECTURE = "ViTClassifier"
    cfg.MODEL.NUM_CLASSES = 4
    cfg.INPUT.MAX_SIZE_TRAIN = cfg.INPUT.MAX_SIZE_TEST = 64
    cfg.MODEL.VIT.DIM, cfg.MODEL.VIT.DEPTH, cfg.MODEL.VIT.HEADS = 32, 3, 4
    for key, value in overrides.items():
        node = cfg
        *path, last = key.split(".")
        for part in path:
            node = getattr(node, part)
        setattr(node, last, value)
    return cfg


def _image(height: int, width: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (3, height, width), generator=generator, dtype=torch.uint8)


def _batch():
    return [{"image": _image(20, 30, 0), "label": 1}, {"image": _image(33, 17, 1), "label": 3}]


def test_builds_from_config_with_the_vit_keys():
    torch.manual_seed(0)
    model = build_model(_cfg())
    assert isinstance(model, ViTClassifier) and model.training
    assert len(model.blocks) == 3 and model.patch_embed.stride == (8, 8)
    assert model.patch_embed.out_channels == 32 and model.head.out_features == 4
    # the position grid covers the largest training image: 64 px * RANDOM_SCALE 1.2 / 8
    assert model.pos_row.shape == (10, 32)


def test_training_returns_loss_and_eval_returns_logits():
    torch.manual_seed(0)
    model = build_model(_cfg())
    losses = model(_batch())
    assert set(losses) == {"loss_cls"} and losses["loss_cls"].ndim == 0
    losses["loss_cls"].backward()
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    with torch.no_grad():
        logits = model(_batch())
    assert logits.shape == (2, 4) and torch.isfinite(logits).all()


@pytest.mark.parametrize("input_norm", ["image", "pixel"])
def test_eval_logits_do_not_depend_on_batch_mates(input_norm):
    torch.manual_seed(0)
    model = build_model(_cfg(**{"MODEL.CLASSIFIER.INPUT_NORM": input_norm})).eval()
    small = {"image": _image(19, 27, 0)}  # not a multiple of the patch: a partial patch
    with torch.no_grad():
        alone = model([small])
        padded = model([small, {"image": _image(61, 45, 1)}])[:1]
        planned = copy.copy(model)  # padded to a larger canvas with an added, empty sample
        planned.shape_plans = (None, ShapePlan([(64, 64)], batch_size=3, divisibility=8))
        in_plan = planned([small])
    assert in_plan.shape == (1, 4)
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=0)
    torch.testing.assert_close(in_plan, alone, atol=1e-5, rtol=0)


def test_an_added_sample_counts_in_neither_the_loss_nor_the_gradients():
    torch.manual_seed(0)
    model = build_model(_cfg())
    planned = copy.deepcopy(model)
    planned.shape_plans = (ShapePlan([(64, 64)], batch_size=4, divisibility=8), None)
    loss, loss_planned = model(_batch())["loss_cls"], planned(_batch())["loss_cls"]
    torch.testing.assert_close(loss_planned, loss, atol=1e-5, rtol=0)
    loss.backward()
    loss_planned.backward()
    for p, q in zip(model.parameters(), planned.parameters()):
        assert torch.isfinite(q.grad).all()
        torch.testing.assert_close(q.grad, p.grad, atol=1e-5, rtol=1e-4)


def test_the_same_seed_builds_the_same_model():
    states = []
    for _ in range(2):
        torch.manual_seed(3)
        states.append(build_model(_cfg()).state_dict())
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_the_blocks_are_the_depth_transformer_blocks_and_hold_their_parameters():
    model = build_model(_cfg(**{"MODEL.VIT.DEPTH": 5}))
    blocks = model_blocks(model)
    assert blocks == list(model.blocks) and len(blocks) == 5
    outside = {name.split(".")[0] for name, _ in model.named_parameters()} - {"blocks"}
    assert outside == {"patch_embed", "pos_row", "pos_col", "norm", "head"}


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("MODEL.VIT.DIM", 30, r"MODEL\.VIT\.DIM must be a positive multiple of HEADS, got 30"),
        ("MODEL.VIT.DEPTH", 0, r"MODEL\.VIT\.DEPTH must be >= 1, got 0"),
        ("MODEL.VIT.PATCH_SIZE", 0, r"MODEL\.VIT\.PATCH_SIZE must be >= 1, got 0"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_key(key, value, message):
    with pytest.raises(ConfigError, match=message) as info:
        build_model(_cfg(**{key: value}))
    assert "\n" not in str(info.value)


_STEM = {"MODEL.VIT.STEM_CHANNELS": [4, 8], "MODEL.CLASSIFIER.CONVS_PER_STAGE": 1}


def test_a_stem_of_conv_stages_feeds_a_smaller_patch_embedding():
    torch.manual_seed(0)
    model = build_model(_cfg(**_STEM))
    assert len(model.stem) == 2 and model.patch_embed.in_channels == 8
    # 8 px patches after a stride-4 stem: the embedding covers 2x2 stem pixels
    assert model.patch_embed.kernel_size == model.patch_embed.stride == (2, 2)
    losses = model(_batch())
    losses["loss_cls"].backward()
    assert all(p.grad is not None for p in model.parameters())
    # the stem is part of the root, not a block; the blocks stay the transformer blocks
    assert model_blocks(model) == list(model.blocks) and len(model.blocks) == 3
    outside = {name.split(".")[0] for name, _ in model.named_parameters()} - {"blocks"}
    assert outside == {"stem", "patch_embed", "pos_row", "pos_col", "norm", "head"}


def test_with_a_stem_eval_logits_do_not_depend_on_batch_mates():
    torch.manual_seed(0)
    model = build_model(_cfg(**_STEM))
    model(_batch())  # one training step's batch statistics, so BN is not the identity
    model.eval()
    small = {"image": _image(19, 27, 0)}
    with torch.no_grad():
        alone = model([small])
        padded = model([small, {"image": _image(61, 45, 1)}])[:1]
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=0)


def test_a_patch_size_the_stem_stride_does_not_divide_is_refused_in_one_line():
    cfg = _cfg(**_STEM, **{"MODEL.VIT.PATCH_SIZE": 6})
    with pytest.raises(ConfigError, match=r"MODEL\.VIT\.PATCH_SIZE .*STEM_CHANNELS") as info:
        build_model(cfg)
    message = str(info.value)
    assert "\n" not in message and "got 6" in message and "stride 4" in message


@pytest.fixture
def one_process_group():
    assert not dist.is_initialized()
    yield
    if dist.is_initialized():  # shard_model started a one-process group
        dist.destroy_process_group()


def test_sharded_on_one_process_it_trains_the_same_step_as_unsharded(one_process_group):
    torch.manual_seed(0)
    model = build_model(_cfg())
    plain = copy.deepcopy(model)
    sharded = shard_model(model, activation_checkpointing=True)
    losses = []
    for net in (plain, sharded):
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
        loss = net(_batch())["loss_cls"]
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            losses.append((loss.detach(), net(_batch())["loss_cls"]))
    (before, after), (sharded_before, sharded_after) = losses
    assert after != before  # the step changed the model
    torch.testing.assert_close(sharded_before, before, atol=1e-6, rtol=0)
    torch.testing.assert_close(sharded_after, after, atol=1e-5, rtol=0)
