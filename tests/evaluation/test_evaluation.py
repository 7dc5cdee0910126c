import logging

import pytest
import torch
from torch import nn

from tests.dist import run_on_ranks
from trainkit.config import get_cfg
from trainkit.evaluation import (
    DatasetEvaluator,
    DatasetEvaluators,
    inference_on_dataset,
    print_csv_format,
    verify_results,
)
from trainkit.utils import comm


class _CountingEvaluator(DatasetEvaluator):
    """Counts samples and correct predictions; gathers per-rank counts in evaluate()."""

    def __init__(self, task="cls"):
        self.task = task
        self.reset()

    def reset(self):
        self.num_seen = 0
        self.num_correct = 0

    def process(self, inputs, outputs):
        _, labels = inputs
        self.num_seen += len(labels)
        self.num_correct += int((outputs.argmax(dim=1) == labels).sum())

    def evaluate(self):
        per_rank = comm.gather((self.num_seen, self.num_correct))
        if not comm.is_main_process():
            return None
        seen = sum(s for s, _ in per_rank)
        correct = sum(c for _, c in per_rank)
        return {self.task: {"num_seen": seen, "accuracy": 100.0 * correct / seen}}


class _Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.seen_modes = []

    def forward(self, batch):
        self.seen_modes.append((self.training, torch.is_grad_enabled()))
        features, _ = batch
        return self.fc(features)


def _loader(num_batches=8, batch_size=3):
    generator = torch.Generator().manual_seed(0)
    return [
        (
            torch.randn(batch_size, 2, generator=generator),
            torch.randint(0, 2, (batch_size,), generator=generator),
        )
        for _ in range(num_batches)
    ]


def test_inference_runs_in_eval_no_grad_and_restores_train_mode():
    model = _Model().train()
    results = inference_on_dataset(model, _loader(), _CountingEvaluator())
    assert results["cls"]["num_seen"] == 24
    assert set(model.seen_modes) == {(False, False)}
    assert model.training


def test_inference_restores_mode_on_error_and_eval_mode_stays():
    class _Failing(_Model):
        def forward(self, batch):
            raise RuntimeError("boom")

    model = _Failing().train()
    with pytest.raises(RuntimeError, match="boom"):
        inference_on_dataset(model, _loader(), None)
    assert model.training

    model = _Model().eval()
    inference_on_dataset(model, _loader(), [])
    assert not model.training


def test_evaluator_none_list_and_duplicate_keys():
    assert inference_on_dataset(_Model(), _loader(2), None) == {}
    both = inference_on_dataset(
        _Model(), iter(_loader(2)), [_CountingEvaluator("a"), _CountingEvaluator("b")]
    )
    assert set(both) == {"a", "b"}
    duplicate = DatasetEvaluators([_CountingEvaluator("a"), _CountingEvaluator("a")])
    with pytest.raises(KeyError, match="'a'"):
        inference_on_dataset(_Model(), _loader(2), duplicate)


def _evaluate_on_rank():
    # Each rank sees a different share; rank 0's result must cover both.
    torch.manual_seed(0)
    model = _Model()
    loader = _loader(num_batches=2 + comm.get_rank())
    return inference_on_dataset(model, loader, _CountingEvaluator())


@pytest.mark.distributed
def test_inference_gathers_results_from_every_rank():
    results = run_on_ranks(_evaluate_on_rank, 2, timeout_s=60)
    assert results[0]["cls"]["num_seen"] == (2 + 3) * 3
    assert results[1] == {}


@pytest.fixture
def trainkit_log(caplog):
    # setup_logger() may have stopped "trainkit" from propagating to caplog's root handler.
    target = logging.getLogger("trainkit")
    attach = not target.propagate
    if attach:
        target.addHandler(caplog.handler)
    yield caplog
    if attach:
        target.removeHandler(caplog.handler)


def test_print_csv_format_logs_copypaste_lines(trainkit_log):
    caplog = trainkit_log
    with caplog.at_level(logging.INFO, logger="trainkit.evaluation.testing"):
        print_csv_format({"cls": {"top1": 91.5, "top1-cat": 3.0}, "loss": 0.25})
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "copypaste: Task: cls",
        "copypaste: top1",
        "copypaste: 91.5000",
        "copypaste: loss=0.25",
    ]
    with pytest.raises(TypeError):
        print_csv_format([1, 2])


def test_verify_results():
    cfg = get_cfg()
    assert verify_results(cfg, {})
    cfg.TEST.EXPECTED_RESULTS = [["cls", "top1", 90.0, 1.0]]
    assert verify_results(cfg, {"cls": {"top1": 90.5}})
    with pytest.raises(RuntimeError, match="cls/top1: got 80"):
        verify_results(cfg, {"cls": {"top1": 80.0}})
    with pytest.raises(RuntimeError, match="missing"):
        verify_results(cfg, {"det": {}})
    cfg.TEST.EXPECTED_RESULTS = [["cls", "top1", 90.0]]
    with pytest.raises(ValueError, match=r"TEST\.EXPECTED_RESULTS"):
        verify_results(cfg, {})


def test_final_results_table_separates_a_long_metric_name_from_its_value(caplog):
    # vindr-spinexr's AUC metric ran into its value: "...bootstrapAbnormal_b_mean_AUC1.0000".
    long_name = "bootstrapAbnormal_b_mean_AUC"
    results = {"classification": {long_name: 1.0, "top1": 91.5}, "a_very_long_task_name": {"x": 2}}
    with caplog.at_level(logging.INFO, logger="trainkit.evaluation.testing"):
        verify_results(get_cfg(), results)
    (message,) = [r.getMessage() for r in caplog.records if "Final results" in r.getMessage()]
    lines = message.splitlines()[1:]
    assert [line.split() for line in lines] == [
        ["task", "metric", "value"],
        ["classification", long_name, "1.0000"],
        ["classification", "top1", "91.5000"],
        ["a_very_long_task_name", "x", "2.0000"],
    ]
    # the values form one column, at least two spaces after the longest name
    value_columns = {line.rindex(" ") + 1 for line in lines}
    assert len(value_columns) == 1
    assert lines[1][value_columns.pop() - 2 :].startswith("  1.0000")
