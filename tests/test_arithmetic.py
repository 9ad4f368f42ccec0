import pytest

from course_lib.core import arithmetic as A


def test_counter_example_is_2_versus_2_5():
    ex = A.counter_example()
    assert ex["mean_of_means"] == 2.0
    assert ex["global_mean"] == 2.5
    assert ex["local_means"] == [1.0, 3.0]


def test_rank_weights_are_25_and_75_percent():
    assert A.rank_weights([12, 36]) == [0.25, 0.75]
    weighted = sum(w * m for w, m in zip(A.rank_weights([12, 36]), [1.0, 3.0]))
    assert weighted == pytest.approx(2.5)


def test_token_weights_1_24_versus_1_72():
    mom = A.token_weights([12, 36], "mean_of_means")
    assert mom == pytest.approx([1 / 24, 1 / 72])
    assert mom[0] / mom[1] == pytest.approx(3.0)
    assert A.token_weights([12, 36], "global") == pytest.approx([1 / 48, 1 / 48])
    with pytest.raises(ValueError):
        A.token_weights([1], "per_sequence")


def test_scaled_local_losses_average_to_the_global_mean():
    scaled = A.scaled_local_losses([12.0, 108.0], [12, 36])
    assert scaled == pytest.approx([0.5, 4.5])
    assert sum(scaled) / 2 == pytest.approx(2.5)


def test_balanced_counts_hide_the_bias():
    assert A.mean_of_means([12.0, 36.0], [12, 12]) == A.global_mean([12.0, 36.0], [12, 12])
    # Equal local means hide it too, whatever the counts.
    assert A.mean_of_means([24.0, 72.0], [12, 36]) == A.global_mean([24.0, 72.0], [12, 36])


def test_theta_example_same_loss_different_gradient():
    t = A.theta_example(0.0)
    assert t["loss_mean_of_means"] == t["loss_global"] == 1.0
    assert t["grad_mean_of_means"] == 0.0
    assert t["grad_global"] == 1.0


def test_empty_window_is_refused():
    with pytest.raises(ValueError, match="N must be > 0"):
        A.scaled_local_losses([0.0, 0.0], [0, 0])
    with pytest.raises(ValueError):
        A.mean_of_means([1.0, 2.0], [0, 3])
