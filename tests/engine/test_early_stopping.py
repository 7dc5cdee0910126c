"""request_stop, the ImprovementRule, the EarlyStopping hook and BestCheckpointer's patience."""

import logging
import math

import pytest

from tests.dist import run_on_ranks
from trainkit.config import ConfigError, get_cfg
from trainkit.engine import hooks
from trainkit.engine.hooks.early_stopping import early_stopping_from_config
from trainkit.engine.train_loop import HookBase, TrainerBase
from trainkit.utils import comm
from trainkit.utils.events import EventWriter


class _Trainer(TrainerBase):
    def __init__(self):
        super().__init__()
        self.steps = []

    def run_step(self):
        self.steps.append(self.iter)


class _Recorder(HookBase):
    """Registered last: records which after_step / after_train calls happened."""

    def __init__(self):
        self.after_steps, self.after_train_iter = [], None

    def after_step(self):
        self.after_steps.append(self.trainer.iter)

    def after_train(self):
        self.after_train_iter = self.trainer.iter


def _eval_sequence(values, key="acc"):
    """An eval function that returns the next value of ``values`` at each call."""
    values = iter(values)
    calls = []

    def evaluate():
        calls.append(1)
        return {key: next(values)}

    return evaluate, calls


# ---- the rule ---------------------------------------------------------------------------
def test_rule_counts_evaluations_since_the_best_and_stops_on_patience():
    rule = hooks.ImprovementRule("max", patience=3)
    decisions = []
    for i, value in enumerate([0.5, 0.6, 0.55, 0.58, 0.59, 0.9]):
        improved = rule.update(value, i)
        decisions.append((improved, rule.evals_without_improvement, rule.should_stop))
    assert decisions == [
        (True, 0, False),
        (True, 0, False),
        (False, 1, False),
        (False, 2, False),
        (False, 3, True),
        (True, 0, False),
    ]
    assert (rule.best_metric, rule.best_iter) == (0.9, 5)


def test_rule_min_mode_with_min_delta():
    rule = hooks.ImprovementRule("min", min_delta=0.1, patience=2)
    assert rule.update(1.0, 0)
    assert not rule.update(0.95, 1)  # better, but not by more than 0.1
    assert rule.update(0.85, 2)
    assert not rule.update(0.8, 3) and not rule.update(0.9, 4)
    assert rule.should_stop
    assert "has not improved by more than 0.1 for 2 evaluations" in rule.reason("val/loss")
    assert "best 0.85 at iteration 2" in rule.reason("val/loss")


def test_rule_without_patience_never_stops_and_nan_first_is_kept_as_detectron2_does():
    rule = hooks.ImprovementRule("min")
    assert rule.update(math.nan, 0)
    assert not any(rule.update(v, i) for i, v in enumerate([0.1, 0.2], start=1))
    assert not rule.should_stop


def test_rule_state_round_trips_and_reads_an_old_state():
    rule = hooks.ImprovementRule("max", patience=2)
    assert rule.state_dict() == {}
    rule.update(1.0, 3)
    rule.update(0.5, 5)
    other = hooks.ImprovementRule("max", patience=2)
    other.load_state_dict(rule.state_dict())
    assert other.update(0.7, 7) is False and other.should_stop
    other.load_state_dict({"best_metric": 2.0, "best_iter": 1})  # a BestCheckpointer's old state
    assert other.evals_without_improvement == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "best"}, "mode"),
        ({"patience": 0}, "patience"),
        ({"min_delta": -1.0}, "min_delta"),
        ({"min_delta": math.inf}, "min_delta"),
    ],
)
def test_rule_validates_its_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hooks.ImprovementRule(**kwargs)


# ---- request_stop ---------------------------------------------------------------------
def test_request_stop_ends_after_the_current_step_and_runs_the_rest_of_it():
    trainer = _Trainer()
    recorder = _Recorder()
    trainer.register_hooks(
        [
            hooks.CallbackHook(after_step=lambda t: t.iter == 3 and t.request_stop("enough")),
            recorder,  # after the requesting hook: its after_step of iteration 3 still runs
        ]
    )
    trainer.train(0, 10)
    assert trainer.steps == [0, 1, 2, 3]
    assert recorder.after_steps == [0, 1, 2, 3]
    assert recorder.after_train_iter == 3  # the last finished iteration: iter < max_iter
    assert trainer.iter == 3 and trainer.stop_reason == "enough"
    assert trainer.state_dict()["stop_reason"] == "enough"


def test_a_stop_requested_at_the_last_iteration_is_a_completed_run():
    trainer = _Trainer()
    trainer.register_hooks(
        [hooks.CallbackHook(after_step=lambda t: t.iter == 4 and t.request_stop("late"))]
    )
    trainer.train(0, 5)
    assert trainer.iter == 5 and trainer.stop_reason is None
    assert "stop_reason" not in trainer.state_dict()


def test_the_first_reason_wins_and_a_failure_is_not_a_stop():
    trainer = _Trainer()

    def after_step(t):
        t.request_stop("first")
        t.request_stop("second")
        raise RuntimeError("crash")

    trainer.register_hooks([hooks.CallbackHook(after_step=after_step)])
    seen = []
    trainer.register_hooks([hooks.CallbackHook(after_train=lambda t: seen.append(t.stop_reason))])
    with pytest.raises(RuntimeError, match="crash"):
        trainer.train(0, 5)
    assert seen == [None]  # after_train hooks can tell a failure from a requested stop


def test_a_trainer_restored_from_a_stopped_run_does_not_train(caplog):
    stopped = _Trainer()
    stopped.register_hooks(
        [hooks.CallbackHook(after_step=lambda t: t.iter == 2 and t.request_stop("plateau"))]
    )
    stopped.train(0, 10)

    resumed = _Trainer()
    writer = _ClosingWriter()
    resumed.register_hooks([hooks.PeriodicWriter([writer])])
    resumed.load_state_dict(stopped.state_dict())
    with caplog.at_level(logging.WARNING, logger="trainkit.engine.trainer_base"):
        resumed.train(3, 10)
    assert resumed.steps == []
    assert "Not training: this run stopped early after iteration 2 (plateau)" in caplog.text
    assert writer.closed  # the writers opened for the run are closed


class _ClosingWriter(EventWriter):
    closed = False

    def write(self):
        pass

    def close(self):
        self.closed = True


# ---- the EarlyStopping hook -----------------------------------------------------------
def test_early_stopping_stops_at_the_evaluation_that_exhausts_patience():
    # evaluations after iterations 1, 3, 5, 7, 9: 0.5, 0.6 (best), 0.6, 0.55 -> 2 without
    evaluate, calls = _eval_sequence([0.5, 0.6, 0.6, 0.55, 0.9, 0.9])
    trainer = _Trainer()
    stopper = hooks.EarlyStopping(2, "acc", mode="max", patience=2)
    recorder = _Recorder()
    trainer.register_hooks([hooks.EvalHook(2, evaluate), stopper, recorder])
    trainer.train(0, 20)
    assert trainer.steps == list(range(8))
    assert len(calls) == 4  # no evaluation after a stopped run
    assert recorder.after_train_iter == 7
    assert trainer.stop_reason.startswith("early stopping: acc has not improved for 2 evaluations")
    latest = trainer.storage.latest()
    assert latest["early_stop/stopped"] == (1, 7)
    assert latest["early_stop/best"] == (0.6, 7)
    assert latest["early_stop/best_iter"] == (3, 7)
    assert latest["early_stop/evals_without_improvement"] == (2, 7)
    assert trainer.state_dict()["hooks"]["EarlyStopping"]["best_iter"] == 3


def test_early_stopping_progress_is_resumable():
    # after 1: 0.5 (best); after 3: 0.4 (one without); after training: 0.45 (not checked)
    evaluate, _ = _eval_sequence([0.5, 0.4, 0.45, 0.3])
    first = _Trainer()
    first.register_hooks([hooks.EvalHook(2, evaluate), hooks.EarlyStopping(2, "acc", patience=2)])
    first.train(0, 5)
    resumed = _Trainer()
    resumed.register_hooks([hooks.EvalHook(2, evaluate), hooks.EarlyStopping(2, "acc", patience=2)])
    resumed.load_state_dict(first.state_dict())
    resumed.train(5, 20)
    assert resumed.steps == [5]  # the evaluation after 5 is the second without improvement


def test_a_metric_the_evaluation_does_not_record_is_a_clear_error():
    evaluate, _ = _eval_sequence([0.5], key="top1")
    trainer = _Trainer()
    trainer.register_hooks([hooks.EvalHook(2, evaluate), hooks.EarlyStopping(2, "top5")])
    with pytest.raises(ConfigError, match=r"'top5' .* iteration 1 \(recorded then: \['top1'\]\)"):
        trainer.train(0, 10)


def _cfg(**early_stop):
    cfg = get_cfg()
    cfg.TEST.EVAL_PERIOD = 10
    for key, value in early_stop.items():
        setattr(cfg.TEST.EARLY_STOP, key, value)
    return cfg


def test_config_builds_the_hook_only_when_a_metric_is_named():
    assert early_stopping_from_config(_cfg()) is None
    hook = early_stopping_from_config(_cfg(METRIC="validation/total_loss", MODE="min", PATIENCE=3))
    assert isinstance(hook, hooks.EarlyStopping)
    assert (hook.rule.mode, hook.rule.patience, hook.rule.min_delta) == ("min", 3, 0.0)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"MODE": "highest"}, "TEST.EARLY_STOP.MODE must be 'max' or 'min', got 'highest'"),
        ({"PATIENCE": 0}, "TEST.EARLY_STOP.PATIENCE must be >= 1"),
        ({"MIN_DELTA": -0.5}, "TEST.EARLY_STOP.MIN_DELTA must be >= 0, got -0.5"),
    ],
)
def test_config_errors_name_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match):
        early_stopping_from_config(_cfg(METRIC="acc", **overrides))


def test_config_refuses_early_stopping_without_periodic_evaluation():
    cfg = _cfg(METRIC="acc")
    cfg.TEST.EVAL_PERIOD = 0
    with pytest.raises(ConfigError, match="TEST.EVAL_PERIOD=0"):
        early_stopping_from_config(cfg)


# ---- checkpoints on a stop ------------------------------------------------------------
class _FakeCheckpointer:
    def __init__(self):
        self.saves = []
        self.save_dir = ""
        self.path_manager = None

    def save(self, name, **extra):
        self.saves.append((name, extra))


class _FakeRunState:
    def __init__(self):
        self.prepared = 0

    def prepare_save(self):
        self.prepared += 1


def test_periodic_checkpointer_writes_the_final_checkpoint_of_a_stopped_run():
    checkpointer = _FakeCheckpointer()
    run_state = _FakeRunState()
    trainer = _Trainer()
    trainer.register_hooks(
        [
            hooks.PeriodicCheckpointer(checkpointer, 4, run_state=run_state),
            hooks.CallbackHook(after_step=lambda t: t.iter == 5 and t.request_stop("done")),
        ]
    )
    trainer.train(0, 20)
    assert [(n, e["iteration"]) for n, e in checkpointer.saves] == [
        ("model_0000003", 3),
        ("model_final", 5),
    ]
    assert run_state.prepared == 2  # before each save, on every rank


def test_best_checkpointer_patience_saves_improvements_then_stops():
    evaluate, _ = _eval_sequence([1.0, 0.8, 0.9, 0.85, 0.7])
    checkpointer = _FakeCheckpointer()
    best = hooks.BestCheckpointer(2, checkpointer, "acc", mode="min", patience=2)
    trainer = _Trainer()
    trainer.register_hooks([hooks.EvalHook(2, evaluate), best])
    trainer.train(0, 20)
    assert [e["iteration"] for _, e in checkpointer.saves] == [1, 3]
    assert trainer.steps[-1] == 7  # 0.9 and 0.85 after iterations 5 and 7 did not improve
    assert trainer.stop_reason.startswith("BestCheckpointer: acc has not improved")
    assert (best.best_metric, best.best_iter) == (0.8, 3)


def test_best_checkpointer_without_patience_never_stops():
    evaluate, _ = _eval_sequence([1.0] + [0.5] * 20)
    trainer = _Trainer()
    trainer.register_hooks(
        [hooks.EvalHook(2, evaluate), hooks.BestCheckpointer(2, _FakeCheckpointer(), "acc")]
    )
    trainer.train(0, 20)
    assert trainer.iter == 20 and trainer.stop_reason is None


# ---- several processes ------------------------------------------------------------------
def _stop_on_two_ranks():
    rank = comm.get_rank()
    # rank 0 (whose evaluation results count) plateaus; rank 1 would keep "improving".
    values = [0.5, 0.7, 0.6, 0.6, 0.6] if rank == 0 else [0.1 * i for i in range(1, 20)]
    evaluate, _ = _eval_sequence(values)
    agreed = []

    def step_collective(t):
        # a collective in every step: a rank that stopped alone would leave the other hanging
        agreed.append(len(set(comm.all_gather(t.iter))) == 1)

    trainer = _Trainer()
    trainer.register_hooks(
        [
            hooks.CallbackHook(after_step=step_collective),
            hooks.EvalHook(2, evaluate),
            hooks.EarlyStopping(2, "acc", patience=2),
        ]
    )
    trainer.train(0, 30)
    return {"last": trainer.steps[-1], "agreed": all(agreed), "reason": trainer.stop_reason}


@pytest.mark.distributed
def test_rank_zero_decides_and_both_ranks_stop_after_the_same_step():
    r0, r1 = run_on_ranks(_stop_on_two_ranks, 2, timeout_s=90)
    # best 0.7 after iteration 3; 0.6 after 5 and 7: patience 2 runs out after iteration 7
    assert r0["last"] == r1["last"] == 7
    assert r0["agreed"] and r1["agreed"]
    assert r0["reason"] == r1["reason"]
