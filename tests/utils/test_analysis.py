"""trainkit.utils.analysis: FLOPs, activations and unused parameters of a model taking a batch."""

import torch
from torch import nn

from trainkit.utils.analysis import (
    FlopCountAnalysis,
    activation_count_operators,
    find_unused_parameters,
    flop_count_operators,
    parameter_count,
    parameter_count_table,
)


class _Net(nn.Module):
    """A trainkit-style model: a list of dicts in, per-image dicts (eval) or losses (train)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1, bias=False)  # 8*3*3*3 = 216 MACs per pixel
        self.norm = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)  # 32 MACs per image
        self.unused = nn.Linear(4, 4)

    def forward(self, batch):
        images = torch.stack([record["image"] for record in batch])
        logits = self.head(torch.relu(self.norm(self.conv(images))).mean((2, 3)))
        if self.training:
            labels = torch.tensor([record["label"] for record in batch])
            return {"loss_cls": nn.functional.cross_entropy(logits, labels)}
        return [{"scores": row} for row in logits]


def _batch(n=2):
    return [
        {"image": torch.rand(3, 16, 16), "label": k % 4, "file_name": "x.png"} for k in range(n)
    ]


def test_flop_count_analysis_of_a_batch_counts_conv_and_linear():
    model = _Net().eval()
    analysis = FlopCountAnalysis(model, _batch(2))
    by_op = analysis.by_operator()
    assert by_op["conv"] == 2 * 16 * 16 * 216
    assert by_op["linear"] == 2 * 32
    assert analysis.total() == sum(by_op.values())
    assert analysis.by_module()["conv"] == by_op["conv"]
    assert analysis.unsupported_ops() == {}  # relu and mean are counted as zero, silently


def test_flop_count_operators_in_gflops_in_eval_mode_then_mode_restored():
    model = _Net().train()
    wrapped = nn.DataParallel(model)  # looked through
    gflops = flop_count_operators(wrapped, _batch(1))
    assert gflops["conv"] == 16 * 16 * 216 / 1e9
    assert model.training


def test_activation_count_operators_in_millions():
    counts = activation_count_operators(_Net(), _batch(1))
    assert counts["conv"] == 8 * 16 * 16 / 1e6
    assert counts["linear"] == 4 / 1e6


def test_find_unused_parameters_leaves_no_trace():
    model = _Net().eval()
    running_mean = model.norm.running_mean.clone()
    assert find_unused_parameters(model, _batch(2)) == ["unused.weight", "unused.bias"]
    assert not model.training
    assert torch.equal(model.norm.running_mean, running_mean)
    assert all(p.grad is None for p in model.parameters())


def test_parameter_counts_are_fvcores():
    counts = parameter_count(_Net())
    assert counts["conv"] == 216 and counts["head"] == 36
    assert "conv" in parameter_count_table(_Net())
