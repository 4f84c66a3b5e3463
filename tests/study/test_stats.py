"""The study's statistics (raystream/study/stats.py) and the one Markdown table writer (raystream/markdown_table.py)."""

import math

import pytest

from raystream.markdown_table import markdown_table
from raystream.study.stats import mean, mean_std, spearman, std


def test_mean_and_std_over_seeds_are_the_sample_ones():
    assert mean([1.0, 2.0, 4.0]) == pytest.approx(7 / 3)
    assert std([1.0, 2.0, 4.0]) == pytest.approx(math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2))
    assert (mean([5.0]), std([5.0])) == (5.0, 0.0)  # one seed: no spread
    assert (mean([]), std([])) == (None, None)
    assert mean_std([0.5, 1.5]) == pytest.approx((1.0, math.sqrt(0.5)))


def test_spearman_is_the_rank_correlation_with_an_exact_permutation_p():
    assert spearman([1, 2, 3, 4, 5], [2, 4, 6, 8, 10]) == pytest.approx((1.0, 2 / 120))  # 2 of 5! at |1|
    assert spearman([1, 2, 3, 4, 5], [1, 3, 2, 5, 4]) == pytest.approx((0.8, 16 / 120))
    assert spearman([0.1, 0.5, 0.5, 0.9], [3.0, 1.0, 2.0, 0.0])[0] == pytest.approx(-0.9486833)  # ties
    rho, p = spearman([1, 2, 3], [7, 7, 7])
    assert math.isnan(rho) and p is None
    assert spearman(list(range(9)), list(range(9))) == (pytest.approx(1.0), None)  # past exact


def test_a_markdown_table_is_a_header_a_separator_and_a_row_per_line():
    assert markdown_table(["a", "b"], [["1", "2"], ["x", "y"]]) == "| a | b |\n|---|---|\n| 1 | 2 |\n| x | y |"
    assert markdown_table(["only"], []) == "| only |\n|---|"
