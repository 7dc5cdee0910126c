"""The slow-rank rule on injected timings: who is named, after how many periods, which phase."""

import random
import statistics

import pytest

from trainkit.engine.straggler_rule import StragglerRule, own_work_s, slowest_phase


def _rank(data=0.01, fb=0.04, optimizer=0.005, hooks=0.001, collective=0.0):
    return {
        "data": data,
        "forward/backward": fb,
        "optimizer": optimizer,
        "hooks": hooks,
        "collective": collective,
    }


def _balanced(world_size):
    return [_rank() for _ in range(world_size)]


def test_own_work_leaves_out_collective_checkpoint_and_eval():
    phases = {**_rank(collective=5.0), "checkpoint": 3.0, "eval": 2.0}
    assert own_work_s(phases) == pytest.approx(0.056)


def test_a_rank_is_named_after_three_slow_periods_in_a_row():
    rule = StragglerRule()
    slow = [*_balanced(3), _rank(data=0.08)]  # own work 0.126 s vs 0.056 s: 2.25x
    assert rule.update(slow) == []
    assert rule.update(slow) == []
    (named,) = rule.update(slow)
    assert (named.rank, named.phase, named.periods_in_a_row) == (3, "data", 3)
    assert named.ratio == pytest.approx(0.126 / 0.056)
    assert named.excess_s == pytest.approx(0.07)
    assert rule.max_ratio == pytest.approx(named.ratio)
    assert rule.update(slow)[0].periods_in_a_row == 4  # named again while it stays slow


def test_a_fine_period_starts_the_count_again():
    rule = StragglerRule()
    slow = [*_balanced(3), _rank(data=0.08)]
    for figures in (slow, slow, _balanced(4), slow, slow):
        assert rule.update(figures) == []
    assert [r.rank for r in rule.update(slow)] == [3]


def test_the_phase_named_is_the_one_that_differs_most():
    rule = StragglerRule(periods=1)
    # Slower in every own-work phase, by far the most in the optimizer.
    figures = [*_balanced(4), _rank(data=0.02, fb=0.05, optimizer=0.05, hooks=0.002)]
    (named,) = rule.update(figures)
    assert named.phase == "optimizer"
    assert slowest_phase(figures, 4) == ("optimizer", pytest.approx(0.045))


def test_waiting_in_collectives_names_nobody():
    # The fast ranks wait for the slow one: equal step times, only the own work differs.
    rule = StragglerRule(periods=1)
    figures = [_rank(collective=0.07), _rank(collective=0.07), _rank(data=0.08)]
    assert [r.rank for r in rule.update(figures)] == [2]
    rule = StragglerRule(periods=1)
    assert rule.update([_rank(collective=1.0), _rank()]) == []


@pytest.mark.parametrize("world_size", [2, 3, 4, 8, 64])
def test_a_balanced_run_with_20_percent_noise_names_nobody(world_size):
    rng = random.Random(world_size)
    rule = StragglerRule()

    def noisy(seconds):
        return seconds * rng.uniform(0.8, 1.2)

    for _ in range(300):
        figures = [
            _rank(noisy(0.01), noisy(0.04), noisy(0.005), noisy(0.001), noisy(0.02))
            for _ in range(world_size)
        ]
        assert rule.update(figures) == []
        assert rule.max_ratio < 1.5


def test_two_ranks_the_slow_one_is_compared_with_the_other_not_the_mean():
    # Against the median of both (their mean) a 1.5x rank would be only 1.2x.
    rule = StragglerRule(periods=1)
    fast = _rank()
    slow = {phase: 1.5 * seconds for phase, seconds in fast.items()}
    (named,) = rule.update([fast, slow])
    assert named.rank == 1 and named.ratio == pytest.approx(1.5)
    assert named.phase == "forward/backward"
    slightly = {phase: 1.45 * seconds for phase, seconds in fast.items()}
    assert StragglerRule(periods=1).update([slightly, fast]) == []


def test_one_rank_names_nobody():
    rule = StragglerRule(periods=1)
    assert rule.update([_rank(data=10.0)]) == []
    assert rule.max_ratio == 1.0


def test_a_smaller_margin_and_fewer_periods():
    rule = StragglerRule(margin=0.2, periods=1)
    (named,) = rule.update([*_balanced(2), {**_rank(), "forward/backward": 0.052}])
    assert named.rank == 2 and named.ratio == pytest.approx(0.068 / 0.056)


def test_several_slow_ranks_are_named_slowest_first():
    rule = StragglerRule(periods=1)
    figures = [*_balanced(5), _rank(data=0.06), _rank(fb=0.2)]
    assert [(r.rank, r.phase) for r in rule.update(figures)] == [
        (6, "forward/backward"),
        (5, "data"),
    ]


def test_a_new_world_size_starts_the_counts_again():
    rule = StragglerRule(periods=2)
    assert rule.update([*_balanced(2), _rank(data=0.1)]) == []
    assert rule.update([*_balanced(3), _rank(data=0.1)]) == []
    assert [r.rank for r in rule.update([*_balanced(3), _rank(data=0.1)])] == [3]


@pytest.mark.parametrize("margin, periods", [(0, 3), (-0.1, 3), (0.5, 0)])
def test_bad_arguments(margin, periods):
    with pytest.raises(ValueError):
        StragglerRule(margin, periods)


def test_the_others_median_is_the_median_of_the_other_ranks():
    rng = random.Random(0)
    for world_size in (2, 3, 4, 5, 9):
        own = [rng.choice([0.5, 1.0, 2.0, rng.random()]) for _ in range(world_size)]
        rule = StragglerRule(margin=1e-6, periods=1)
        named = {r.rank: r for r in rule.update([{"data": s} for s in own])}
        for rank, seconds in enumerate(own):
            others = statistics.median(own[:rank] + own[rank + 1 :])
            if rank in named:
                assert named[rank].others_s == pytest.approx(others)
            else:
                assert seconds < others * (1 + 1e-6) + 1e-9
