"""log_first_n, log_every_n and log_every_n_seconds: throttled by call site, fake clock."""

import logging

import pytest
import torch

from trainkit.evaluation import inference_on_dataset
from trainkit.utils import logger as logger_module
from trainkit.utils.logger import (
    LogThrottle,
    log_every_n,
    log_every_n_seconds,
    log_first_n,
)


class _FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def clock(monkeypatch):
    """A fresh throttle (nothing counted yet) whose time only moves when the test says so."""
    fake = _FakeClock()
    monkeypatch.setattr(logger_module, "_THROTTLE", LogThrottle(clock=fake))
    return fake


@pytest.fixture
def captured():
    """Records of the logger named "throttle_test" (and its children)."""
    target = logging.getLogger("throttle_test")
    handler = _Records()
    old_level = target.level
    target.setLevel(logging.DEBUG)
    target.addHandler(handler)
    yield handler.messages
    target.removeHandler(handler)
    target.setLevel(old_level)


def test_every_n_seconds_throttles_a_changing_message_from_one_place(clock, captured):
    for i in range(10):
        # one call site; the text changes every call (as a progress counter does)
        log_every_n_seconds(logging.INFO, f"done {i}/10", n=5, name="throttle_test")
        clock.now += 1.0
    # logged at t=100, 105 (calls 0 and 5): once per 5 s of the injected clock
    assert captured == ["done 0/10", "done 5/10"]


def test_every_n_seconds_without_a_fake_clock_still_throttles_changing_text(captured):
    # no time passes worth 1000 s here, so one line for the whole loop (the old version
    # keyed the throttle on the text and logged all five)
    for i in range(5):
        log_every_n_seconds(logging.INFO, f"step {i}", n=1000, name="throttle_test")
    assert captured == ["step 0"]


def test_every_n_seconds_keeps_one_timer_per_call_site(clock, captured):
    for i in range(3):
        log_every_n_seconds(logging.INFO, f"a{i}", n=10, name="throttle_test")
        log_every_n_seconds(logging.INFO, f"b{i}", n=10, name="throttle_test")
    assert captured == ["a0", "b0"]
    clock.now += 10.0
    log_every_n_seconds(logging.INFO, "a-late", n=10, name="throttle_test")
    assert captured[-1] == "a-late"


def test_every_n_logs_the_first_call_then_one_in_n_per_place(clock, captured):
    for i in range(7):
        log_every_n(logging.INFO, f"m{i}", n=3, name="throttle_test")
    assert captured == ["m0", "m3", "m6"]
    log_every_n(logging.INFO, "elsewhere", n=3, name="throttle_test")
    assert captured[-1] == "elsewhere"


def test_first_n_by_caller_ignores_the_text(clock, captured):
    for i in range(4):
        log_first_n(logging.INFO, f"x{i}", n=2, name="throttle_test")
    assert captured == ["x0", "x1"]


def test_first_n_by_message_counts_the_text_from_any_place(clock, captured):
    log_first_n(logging.INFO, "same", name="throttle_test", key="message")
    log_first_n(logging.INFO, "same", name="throttle_test", key="message")
    log_first_n(logging.INFO, "other", name="throttle_test", key="message")
    assert captured == ["same", "other"]


def test_first_n_by_caller_and_message(clock, captured):
    for text in ("a", "a", "b"):
        log_first_n(logging.INFO, text, name="throttle_test", key=("caller", "message"))
    assert captured == ["a", "b"]


def test_first_n_rejects_an_unknown_key(clock):
    with pytest.raises(ValueError, match="caller"):
        log_first_n(logging.INFO, "x", key="line")


def test_default_logger_is_the_calling_module(clock, monkeypatch):
    seen = []
    monkeypatch.setattr(
        logging.Logger, "log", lambda self, level, msg, *a, **k: seen.append(self.name)
    )
    log_every_n_seconds(logging.INFO, "hello")
    assert seen == [__name__]


class _Eval:
    def reset(self):
        pass

    def process(self, inputs, outputs):
        pass

    def evaluate(self):
        return {}


def test_inference_progress_is_logged_once_per_period_not_per_batch(clock):
    handler = _Records()
    target = logging.getLogger("trainkit.evaluation.evaluator")
    old_level = target.level
    target.setLevel(logging.INFO)
    target.addHandler(handler)
    try:
        # the clock stands still: every batch reaches the same throttle within one period
        inference_on_dataset(lambda x: x, [torch.zeros(1)] * 40, _Eval())
    finally:
        target.removeHandler(handler)
        target.setLevel(old_level)
    messages = [m for m in handler.messages if m.startswith("Inference done")]
    assert len(messages) == 1, messages


def test_create_small_table_keeps_long_names_apart_from_values():
    from trainkit.utils.logger import create_small_table

    table = create_small_table({"bootstrapAbnormal_b_mean_AUC": 1.0, "AP": 0.25, "n": 3})
    header, rule, values = table.splitlines()
    assert [cell.strip() for cell in header.strip("|").split("|")] == [
        "bootstrapAbnormal_b_mean_AUC",
        "AP",
        "n",
    ]
    assert [cell.strip() for cell in values.strip("|").split("|")] == ["1.000", "0.250", "3"]
    assert len(header) == len(rule) == len(values)
    assert [i for i, c in enumerate(header) if c == "|"] == [
        i for i, c in enumerate(values) if c == "|"
    ]
    assert create_small_table({}) == ""


def test_log_api_usage_exists_for_projects_copied_modules_and_does_nothing(caplog):
    from trainkit.utils.logger import _log_api_usage

    with caplog.at_level(logging.DEBUG):
        assert _log_api_usage("modeling.meta_arch.MyNet") is None
    assert caplog.records == []
