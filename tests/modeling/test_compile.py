"""The compile seam: padding does not change results, state_dict names, graphs counted.

Compiled with backend "eager" (Dynamo traces, no code generation) to stay fast; the
inductor tests are marked slow.
"""

from __future__ import annotations

import copy
import logging
import os

import pytest
import torch

from trainkit.checkpoint import Checkpointer
from trainkit.config import ConfigError, get_cfg
from trainkit.modeling import ShapePlan, build_model, compile_model, compile_stats
from trainkit.modeling.compile import call_compiled, set_compile_cache_dir


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()  # graphs of other tests share the method's code object
    yield
    torch._dynamo.reset()


def _cfg(compile_on: bool = False, backend: str = "eager", output_dir: str = ""):
    cfg = get_cfg()
    cfg.MODEL.NUM_CLASSES = 4
    cfg.MODEL.CLASSIFIER.CHANNELS = [4, 8]
    cfg.INPUT.MAX_SIZE_TRAIN = cfg.INPUT.MAX_SIZE_TEST = 32
    cfg.INPUT.RANDOM_SCALE = [1.0, 1.0]
    cfg.SOLVER.IMS_PER_BATCH = cfg.TEST.IMS_PER_BATCH = 4
    cfg.MODEL.COMPILE.ENABLED = compile_on
    cfg.MODEL.COMPILE.BACKEND = backend
    cfg.OUTPUT_DIR = output_dir
    return cfg


def _batch(sizes, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [
        {"image": torch.randint(0, 256, (3, h, w), generator=generator, dtype=torch.uint8),
         "label": i % 4}
        for i, (h, w) in enumerate(sizes)
    ]  # fmt: skip


def _pair(tmp_path):
    """An eager model and a compiled one with the same weights."""
    torch.manual_seed(0)
    eager = build_model(_cfg())
    compiled = build_model(_cfg(True, output_dir=str(tmp_path)))
    compiled.load_state_dict(eager.state_dict())
    return eager, compiled


def test_padding_keeps_eval_logits_and_training_loss(tmp_path):
    eager, compiled = _pair(tmp_path)
    batch = _batch([(20, 30), (17, 9), (31, 25)])  # 3 images: padded to 4, and to 32x32
    for model in (eager, compiled):
        for module in model.modules():  # non-trivial running statistics
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_var.fill_(2.0)
    loss_e, loss_c = eager(batch)["loss_cls"], compiled(batch)["loss_cls"]
    torch.testing.assert_close(loss_c, loss_e, rtol=1e-5, atol=1e-6)
    loss_e.backward()
    loss_c.backward()
    for (name, pe), pc in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(pc.grad, pe.grad, rtol=1e-4, atol=1e-6, msg=name)
    # BN running statistics: the added (empty) sample counts in none of them.
    for be, bc in zip(eager.buffers(), compiled.buffers()):
        torch.testing.assert_close(bc, be, rtol=1e-5, atol=1e-6)
    eager.eval()
    compiled.eval()
    with torch.no_grad():
        logits_e, logits_c = eager(batch), compiled(batch)
    assert logits_c.shape == logits_e.shape == (3, 4)
    torch.testing.assert_close(logits_c, logits_e, rtol=1e-5, atol=1e-5)


def test_batches_are_padded_to_the_planned_shapes():
    model = build_model(_cfg())
    model.shape_plans = (ShapePlan([(16, 32), (32, 32)], 4, 16), None)
    images, mask = model.preprocess_image(_batch([(10, 20), (12, 30)]))
    assert images.shape == (4, 3, 16, 32) and mask.shape == (4, 1, 16, 32)
    assert mask[2:].sum() == 0 and mask[0].sum() == 200
    model.eval()
    images, _ = model.preprocess_image(_batch([(10, 20)]))
    assert images.shape == (1, 3, 16, 32)  # no eval plan: the batch's own size


def test_state_dict_has_no_orig_mod_and_loads_both_ways(tmp_path):
    eager, compiled = _pair(tmp_path)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    assert not any("_orig_mod" in k for k in compiled.state_dict())
    compiled(_batch([(20, 20)]))["loss_cls"].backward()  # compiled once: names unchanged
    with torch.no_grad():
        for p in compiled.parameters():
            p.add_(1.0)
    Checkpointer(compiled, str(tmp_path / "c")).save("compiled")
    Checkpointer(eager, str(tmp_path / "c")).load(str(tmp_path / "c" / "compiled.pth"))
    for a, b in zip(eager.state_dict().values(), compiled.state_dict().values()):
        torch.testing.assert_close(a, b)
    fresh = build_model(_cfg(True, output_dir=str(tmp_path)))
    Checkpointer(eager, str(tmp_path / "e")).save("eager")
    Checkpointer(fresh, str(tmp_path / "e")).load(str(tmp_path / "e" / "eager.pth"))
    for a, b in zip(eager.state_dict().values(), fresh.state_dict().values()):
        torch.testing.assert_close(a, b)


@pytest.mark.slow  # ~20 s: Dynamo traces every planned shape
def test_graphs_are_counted_and_stop_growing_once_every_shape_was_seen(tmp_path):
    _, model = _pair(tmp_path)
    train_plan, test_plan = model.shape_plans
    assert compile_stats(model) == compile_stats(model)  # nothing compiled yet: zeros
    assert compile_stats(model).graphs == 0
    shapes = [(h, w) for h, w in train_plan.canvases]
    for _ in range(2):  # the second round sees every shape again: no new graph
        for h, w in shapes:
            model(_batch([(h, w), (h - 3, w - 5)]))["loss_cls"].backward()
        stats = compile_stats(model)
        assert stats.graphs == train_plan.num_shapes
        assert stats.recompiles == train_plan.num_shapes - 1
        assert stats.graph_breaks == 0 and stats.at_limit == ()
    model.eval()
    with torch.no_grad():
        model(_batch([(30, 30)]))
    assert compile_stats(model).graphs == train_plan.num_shapes + 1  # its own eval graph


def test_deepcopy_runs_the_compiled_function_on_its_own_weights(tmp_path):
    _, model = _pair(tmp_path)
    model.eval()
    copied = copy.deepcopy(model)
    with torch.no_grad():
        for p in copied.parameters():
            p.mul_(0.5)
        batch = _batch([(20, 20)])
        assert not torch.allclose(model(batch), copied(batch))


def test_call_compiled_without_compile_runs_the_method():
    model = build_model(_cfg())
    images, mask = torch.zeros(1, 3, 16, 16), torch.ones(1, 1, 16, 16)
    model.eval()
    torch.testing.assert_close(
        call_compiled(model, "eval_network", images, mask), model.eval_network(images, mask)
    )
    assert compile_stats(model) is None


def test_compile_refuses_bad_settings():
    model = build_model(_cfg())
    with pytest.raises(ConfigError, match="MODEL.COMPILE.MODE"):
        compile_model(model, mode="fastest")
    with pytest.raises(ConfigError, match="needs MODEL.COMPILE.BACKEND 'inductor'"):
        compile_model(model, mode="max-autotune", backend="eager")
    with pytest.raises(ConfigError, match="names no method to compile"):
        compile_model(torch.nn.Linear(2, 2))


def test_compile_logs_the_graph_budget(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="trainkit.modeling.compile"):
        build_model(_cfg(True, output_dir=str(tmp_path)))
    assert "at most 3 graphs for training, 3 for evaluation" in caplog.text


def test_cache_dir_goes_to_the_environment_unless_the_user_set_one(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    cache = str(tmp_path / "cache")
    assert set_compile_cache_dir(cache) == cache and os.environ["TORCHINDUCTOR_CACHE_DIR"] == cache
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert set_compile_cache_dir(cache) == str(tmp_path / "mine")


@pytest.mark.slow  # inductor generates and compiles C++: a minute on 2 cores
def test_inductor_cache_in_output_dir_is_found_by_a_second_run(tmp_path, monkeypatch):
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")  # restored after the test
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    batch = _batch([(20, 30), (30, 20)])
    losses = []
    for _run in range(2):  # the second run: a fresh model in the same OUTPUT_DIR
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        model = build_model(_cfg(True, backend="inductor", output_dir=str(tmp_path)))
        losses.append(model(batch)["loss_cls"].detach())
    cache = tmp_path / "compile_cache"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(cache)
    assert any(p.is_file() for p in cache.rglob("*"))
    assert counters["inductor"]["fxgraph_cache_hit"] >= 1  # the second run read the graph
    torch.testing.assert_close(losses[1], losses[0])
