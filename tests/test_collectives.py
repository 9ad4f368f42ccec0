"""Chapter 00's real collectives: two gloo processes leave what the
simulation in plain lists computes."""

from course_lib.course import collectives


def test_the_three_calls_on_two_processes():
    held = collectives.HELD
    total = [a + b for a, b in zip(held[0], held[1], strict=True)]
    expected = {"all_reduce": total, "all_gather": [held[0], held[1]],
                "broadcast": held[0],
                "divided_then_summed": [x / len(held) for x in total]}
    assert collectives.run() == {0: expected, 1: expected}
