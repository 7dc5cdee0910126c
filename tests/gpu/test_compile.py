"""torch.compile on CUDA: a few compiled steps, every planned shape once, then no recompile."""

from __future__ import annotations

import pytest
import torch

from trainkit.config import get_cfg
from trainkit.modeling import build_model, compile_stats

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def _batch(sizes, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [
        {"image": torch.randint(0, 256, (3, h, w), generator=generator, dtype=torch.uint8),
         "label": i % 6}
        for i, (h, w) in enumerate(sizes)
    ]  # fmt: skip


def test_compiled_steps_on_cuda_match_eager_and_stop_recompiling(tmp_path):
    torch._dynamo.reset()
    cfg = get_cfg()
    cfg.merge_from_file("configs/shapes/cnn_small.yaml")
    cfg.MODEL.DEVICE = "cuda"
    cfg.OUTPUT_DIR = str(tmp_path)
    torch.manual_seed(0)
    eager = build_model(cfg)
    cfg.MODEL.COMPILE.ENABLED = True
    model = build_model(cfg)
    model.load_state_dict(eager.state_dict())
    train_plan, test_plan = model.shape_plans
    assert train_plan.num_shapes <= 8 and test_plan.num_shapes <= 8
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for round_ in range(2):
        for h, w in train_plan.canvases:
            batch = _batch([(h, w), (h - 5, w - 3), (h - 9, w - 1)], seed=round_)
            loss = model(batch)["loss_cls"]
            if round_ == 0 and (h, w) == train_plan.canvases[0]:
                torch.testing.assert_close(loss, eager(batch)["loss_cls"], rtol=1e-3, atol=1e-4)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        stats = compile_stats(model)
        # Every planned shape compiled exactly once: the second round adds no graph.
        assert stats.graphs == train_plan.num_shapes
        assert stats.recompiles == train_plan.num_shapes - 1
        assert stats.graph_breaks == 0 and stats.at_limit == ()
    assert torch.isfinite(loss)
    model.eval()
    eager.load_state_dict(model.state_dict())
    eager.eval()
    with torch.no_grad():
        batch = _batch([(64, 48), (50, 40)])
        torch.testing.assert_close(model(batch), eager(batch), rtol=1e-3, atol=1e-3)
    assert compile_stats(model).graphs == train_plan.num_shapes + 1
