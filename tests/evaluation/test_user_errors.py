"""TEST.EXPECTED_RESULTS entries a user writes wrong are ConfigErrors naming the key."""

import pytest

from trainkit.config import ConfigError, get_cfg
from trainkit.evaluation import verify_results
from trainkit.utils import UsageError


@pytest.mark.parametrize(
    "entry", [["classification", "top1", 90.0], ["classification", "top1", "ninety", 0.5]]
)
def test_malformed_expected_result_is_a_config_error_naming_the_key(entry):
    cfg = get_cfg()
    cfg.TEST.EXPECTED_RESULTS = [entry]
    with pytest.raises(ConfigError, match=r"TEST\.EXPECTED_RESULTS entry"):
        verify_results(cfg, {"classification": {"top1": 90.0}})


def test_results_out_of_tolerance_are_not_a_usage_error():
    # A regression of the model, not a mistake in the command line.
    cfg = get_cfg()
    cfg.TEST.EXPECTED_RESULTS = [["classification", "top1", 90.0, 0.5]]
    with pytest.raises(RuntimeError, match="top1") as info:
        verify_results(cfg, {"classification": {"top1": 50.0}})
    assert not isinstance(info.value, UsageError)
