"""The stall rule and a stalled rank in a real job, named by the launcher's guard."""

import time

import pytest

from trainkit.launcher.protocol import describe_stall, find_stalled_rank


def test_longest_stuck_rank_is_blamed():
    records = [
        {"rank": 0, "phase": "forward/backward", "iteration": 7, "elapsed_s": 11.0},
        {"rank": 1, "phase": "data", "iteration": 7, "elapsed_s": 12.5},
    ]
    assert find_stalled_rank(records, 10.0)["rank"] == 1
    assert find_stalled_rank(records, 20.0) is None
    assert find_stalled_rank(records, 0) is None  # disabled
    text = describe_stall(records[1], 10.0)
    assert "rank 1 stopped making progress" in text and "'data'" in text and "iteration 7" in text


def test_the_rank_furthest_behind_is_blamed_even_if_a_waiting_peer_got_there_first():
    # Rank 0 got ahead and entered the collective of step 3 before rank 1 entered the data
    # phase of step 3, where it hangs: rank 0 has waited longer, but rank 1 is the cause.
    records = [
        {"rank": 0, "phase": "forward/backward", "iteration": 3, "elapsed_s": 3.2},
        {"rank": 1, "phase": "data", "iteration": 3, "elapsed_s": 3.1},
    ]
    assert find_stalled_rank(records, 3.0)["rank"] == 1
    # A rank stuck writing a checkpoint after step 5 while its peer waits in step 6.
    records = [
        {"rank": 0, "phase": "checkpoint", "iteration": 5, "elapsed_s": 4.0},
        {"rank": 1, "phase": "forward/backward", "iteration": 6, "elapsed_s": 4.1},
    ]
    assert find_stalled_rank(records, 3.0)["rank"] == 0
    # Equally far: the one stuck longest.
    records = [
        {"rank": 0, "phase": "forward/backward", "iteration": 6, "elapsed_s": 4.0},
        {"rank": 1, "phase": "forward/backward", "iteration": 6, "elapsed_s": 5.0},
    ]
    assert find_stalled_rank(records, 3.0)["rank"] == 1


def _stall_rank_one_in_data(output_dir):
    from tests.engine.test_default_trainer import RegressionTrainer, _cfg
    from trainkit.utils import comm

    class HangingLoader(RegressionTrainer):
        @classmethod
        def build_train_loader(cls, cfg):
            loader = super().build_train_loader(cfg)

            def batches():
                for i, batch in enumerate(loader):
                    if i == 3 and comm.get_rank() == 1:
                        time.sleep(120)  # a hung file system, as far as the job can tell
                    yield batch

            return batches()

    cfg = _cfg(output_dir, max_iter=50, workers=0)
    cfg.WATCHDOG_TIMEOUT_S = 3.0
    HangingLoader(cfg).train()


@pytest.mark.distributed
def test_stalled_rank_is_named_with_its_phase(tmp_path):
    from trainkit.launcher import LaunchError, launch

    start = time.monotonic()
    with pytest.raises(
        LaunchError, match=r"rank 1 stopped making progress: .*phase 'data' at iteration 3"
    ) as info:
        launch(_stall_rank_one_in_data, 2, args=(str(tmp_path),))
    assert info.value.exit_code == 124
    assert time.monotonic() - start < 60  # the collective timeout would be 30 minutes
