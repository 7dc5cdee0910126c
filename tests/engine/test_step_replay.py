"""Replaying a captured failing step in this process: the weights, the records, the report.

The run of tests/engine/test_failed_steps.py (one process, a NaN record at step 9, checkpoints
after iterations 3 and 7) is replayed from model_0000007: step 8 with its update, then step 9.
The multi-process case (two ranks replayed in one process) is tests/tools/test_replay_step.py.
"""

import json
import shutil

import pytest
import torch

from tests.engine.test_failed_steps import (
    PoisonTrainer,
    cfg_for,
    poison,  # noqa: F401  # the fixture
    poison_record_of,
    train,
)
from trainkit.checkpoint import unwrap_model
from trainkit.engine import HookBase, SimpleTrainer
from trainkit.engine.failed_steps import load_trainer_class
from trainkit.engine.replay import ReplayError, replay_failed_step

# The dataset registered, the poisoning reset afterwards.
pytestmark = pytest.mark.usefixtures("poison")


class _WeightsAfter(HookBase):
    def __init__(self, iteration):
        self.iteration, self.weights = iteration, None

    def after_step(self):
        if self.trainer.iter == self.iteration:
            model = unwrap_model(self.trainer.model)
            self.weights = {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("accumulate", [1, 2])
def test_the_replay_reaches_the_runs_weights_and_names_the_record(tmp_path, accumulate):
    cfg = cfg_for(tmp_path, accumulate=accumulate)
    index = poison_record_of(cfg, 9, micro_batch=accumulate - 1)
    before = _WeightsAfter(8)
    train(cfg, hooks=[before])
    folder = tmp_path / "failed_steps" / "iter_9"

    lines = []
    report = replay_failed_step(str(folder), log=lines.append)
    assert report.checkpoint.endswith("model_0000007.pth") and report.replayed == range(8, 9)
    assert lines == ["replayed step 8"]
    assert report.weights.keys() == before.weights.keys()
    assert all(torch.equal(report.weights[k], v) for k, v in before.weights.items())
    assert report.reproduced and report.bad_slots == [(0, accumulate - 1)]
    bad_losses = report.losses[(0, accumulate - 1)]
    assert bad_losses["loss_mse"] != bad_losses["loss_mse"]
    if accumulate == 2:
        assert all(v == v for v in report.losses[(0, 0)].values())
    # BatchNorm1d cannot run one record: the replay drops each record in turn instead.
    (bad,) = report.bad_records
    assert (bad.rank, bad.micro_batch, bad.record_id) == (
        0,
        accumulate - 1,
        f"failed_steps_regression[{index}]",
    )
    assert bad.terms == ["loss_mse", "loss_l1"]
    assert report.grad_norms["all"] != report.grad_norms["all"]
    assert report.non_finite_grads == ["hidden.weight", "hidden.bias", "norm.weight", "norm.bias",
                                       "out.weight", "out.bias"]  # fmt: skip
    text = "\n".join(report.lines())
    assert "Step 9: the failure is reproduced" in text
    assert (
        f"bad record: failed_steps_regression[{index}] (rank 0 micro-batch {accumulate - 1})"
        in text
    )


def test_the_replay_refuses_a_folder_it_cannot_use(tmp_path):
    with pytest.raises(ReplayError, match="holds no step.json"):
        replay_failed_step(str(tmp_path))
    cfg = cfg_for(tmp_path)
    poison_record_of(cfg, 9)
    train(cfg)
    folder = tmp_path / "failed_steps" / "iter_9"
    # Its trainer may save (a final checkpoint when the step does not fail): not over the run's.
    with pytest.raises(ReplayError, match="is the failed run's OUTPUT_DIR"):
        replay_failed_step(str(folder), output_dir=str(tmp_path / "." / ""))
    with pytest.raises(ReplayError, match="not found; give one with --checkpoint"):
        replay_failed_step(str(folder), checkpoint=str(tmp_path / "model_0000099.pth"))
    # A checkpoint from after the step cannot be the start.
    shutil.copy(tmp_path / "model_0000007.pth", tmp_path / "copy.pth")
    step = json.loads((folder / "step.json").read_text())
    step["iteration"] = 5
    (folder / "step.json").write_text(json.dumps(step))
    with pytest.raises(ReplayError, match="holds iteration 7, not before the failing step 5"):
        replay_failed_step(str(folder), checkpoint=str(tmp_path / "copy.pth"))


def test_load_trainer_class_imports_a_module_or_a_script(tmp_path):
    assert load_trainer_class("tests.engine.test_failed_steps:PoisonTrainer") is PoisonTrainer
    script = tmp_path / "my_train.py"
    script.write_text(
        "from trainkit.engine import DefaultTrainer\n"
        "class Trainer(DefaultTrainer):\n    pass\n"
        "if __name__ == '__main__':\n    raise SystemExit('must not run')\n"
    )
    assert load_trainer_class(f"{script}:Trainer").__name__ == "Trainer"
    with pytest.raises(ReplayError, match="has no class Nope"):
        load_trainer_class(f"{script}:Nope")
    with pytest.raises(ReplayError, match="give module:Class"):
        load_trainer_class("Trainer")
    with pytest.raises(ReplayError, match="cannot import"):
        load_trainer_class("no_such_module_here:Trainer")


def _report(num_records, num_bad, non_finite_weights=()):
    from trainkit.engine.replay import BadRecord, ReplayReport

    report = ReplayReport(iteration=9, checkpoint="", replayed=range(0, 9))
    report.losses[(0, 0)] = {"loss_cls": float("nan")}
    report.bad_slots.append((0, 0))
    report.records_tried = num_records
    report.bad_records = [BadRecord(0, 0, f"set[{i}]", ["loss_cls"]) for i in range(num_bad)]
    report.non_finite_weights = list(non_finite_weights)
    return "\n".join(report.lines())


def test_a_report_where_every_record_fails_blames_the_model_and_lists_a_few():
    text = _report(32, 32, ["norm.running_var"])
    assert "every one of the 32 records of the bad micro-batch(es) fails alone" in text
    assert "its weights are not finite before step 9" in text
    assert "non-finite weights before step 9 in 1 tensor(s): norm.running_var" in text
    assert text.count("bad record:") == 5 and "... and 27 more bad records" in text
    finite = _report(8, 8)
    assert "its weights are finite, so look at the learning rate" in finite
    assert "non-finite weights" not in finite


def test_a_report_with_some_bad_records_lists_them_all():
    text = _report(32, 7)
    assert text.count("bad record:") == 7 and "every one" not in text
    alone = _report(1, 1)  # a micro-batch of one record: that record is the one
    assert alone.count("bad record:") == 1 and "every one" not in alone


def test_the_replay_and_the_training_run_the_same_accumulate(tmp_path, monkeypatch):
    # One step implementation: the replay runs SimpleTrainer.accumulate, with the emulated
    # ranks as its gradient combiner, never a copy of the micro-batch loop.
    calls = []
    original = SimpleTrainer.accumulate

    def spy(self, batches):
        calls.append((type(self.gradient_combiner).__name__, len(batches)))
        return original(self, batches)

    monkeypatch.setattr(SimpleTrainer, "accumulate", spy)
    cfg = cfg_for(tmp_path, accumulate=2)
    poison_record_of(cfg, 9, micro_batch=1)
    train(cfg)
    assert len(calls) == 10 and set(calls) == {("GradientCombiner", 2)}  # steps 0..9
    calls.clear()
    replay_failed_step(str(tmp_path / "failed_steps" / "iter_9"))
    assert calls == [("EmulatedRanks", 2)] * 2  # step 8 with its update, then step 9


def test_a_sharded_runs_failing_step_is_replayed_whole_from_its_directory(tmp_path):
    # MODEL.FSDP: the step's records come from the directory's run.pth; the replay holds the
    # whole model on one process and reads the directory whole.
    cfg = cfg_for(tmp_path)
    cfg.MODEL.FSDP.ENABLED = True
    index = poison_record_of(cfg, 9)
    before = _WeightsAfter(8)
    train(cfg, hooks=[before])
    folder = tmp_path / "failed_steps" / "iter_9"
    step = json.loads((folder / "step.json").read_text())
    assert step["last_checkpoint"] == "model_0000007" and step["records"]
    report = replay_failed_step(str(folder))
    assert report.checkpoint.endswith("model_0000007") and report.reproduced
    whole = {
        k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in before.weights.items()
    }
    for name, value in whole.items():  # FSDP's reduce-scatter and DDP's sums agree to rounding
        torch.testing.assert_close(report.weights[name], value, rtol=1e-5, atol=1e-6)
    (bad,) = report.bad_records
    assert bad.record_id == f"failed_steps_regression[{index}]"
