"""The throughput bench keeps each round's rate, so a report shows the ratio round by round."""

import pytest
from bench.suite import Spent, ratios_by_round


def test_each_round_is_kept_and_set_beside_the_same_round_of_the_other() -> None:
    ours, theirs = Spent(), Spent()
    for spent in (ours, theirs):
        spent.add(lambda: None, 4, 2)
        spent.add(lambda: None, 4, 2)
    assert len(ours.round_rates) == len(theirs.round_rates) == 2
    assert all(rate > 0 for rate in ours.round_rates + theirs.round_rates)
    assert ours.done == 8

    ours.round_rates, theirs.round_rates = [8.0, 9.0], [10.0, 12.0]
    assert ratios_by_round(ours, theirs) == [0.8, 0.75]


def test_rounds_that_do_not_pair_up_are_an_error() -> None:
    ours, theirs = Spent(), Spent()
    ours.round_rates, theirs.round_rates = [8.0, 9.0], [10.0]
    with pytest.raises(ValueError):
        ratios_by_round(ours, theirs)
