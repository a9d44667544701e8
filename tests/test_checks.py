"""The shared checks: bad input refused early, and demonstrations of bad input that fail when no error comes."""

import numpy as np
import pytest

from convit_edu.checks import expect_error, number, one_of, positive_int


def test_expect_error_returns_the_kind_and_message_of_the_expected_error():
    assert expect_error(lambda: int("x")) == "ValueError: invalid literal for int() with base 10: 'x'"
    assert expect_error(lambda: open("/nonexistent/file"), FileNotFoundError, ValueError).startswith(
        "FileNotFoundError: ")


def test_expect_error_fails_when_the_call_is_accepted():
    with pytest.raises(AssertionError, match="expected ValueError or TypeError, but the call returned 3"):
        expect_error(lambda: 3, ValueError, TypeError)


def test_expect_error_lets_an_unexpected_kind_of_error_escape():
    with pytest.raises(KeyError):
        expect_error(lambda: {}["missing"], ValueError)


def test_positive_int_takes_integers_and_names_the_bad_value():
    assert positive_int("depth", 12) == 12 and positive_int("depth", np.int64(3)) == 3
    assert positive_int("num_workers", 0, minimum=0) == 0
    with pytest.raises(ValueError, match="depth must be at least 1, got 0"):
        positive_int("depth", 0)
    for bad in (2.5, "3", True, None):
        with pytest.raises(TypeError, match="epochs must be an integer"):
            positive_int("epochs", bad)


def test_one_of_lists_the_choices():
    assert one_of("preset", "deit", ["deit", "imagenet"]) == "deit"
    with pytest.raises(ValueError, match="unknown preset 'deti': choose one of deit, imagenet"):
        one_of("preset", "deti", ["deit", "imagenet"])


def test_number_checks_type_finiteness_and_the_interval():
    assert number("lr", 5e-4, 0, open_low=True) == 5e-4 and number("epochs", np.float32(2.5), 0) == 2.5
    with pytest.raises(TypeError, match="lr must be a number, got '1e-3' \\(write the number without quotes\\)"):
        number("lr", "1e-3")
    with pytest.raises(ValueError, match=r"lr must be a finite number in \(0, inf\), got 0.0"):
        number("lr", 0.0, 0, open_low=True)
    with pytest.raises(ValueError, match=r"in \(-inf, 0\], got inf"):  # an infinite end is never inside
        number("shift", float("inf"), high=0)
    with pytest.raises(ValueError, match=r"in \[0, 1\), got 1.0"):
        number("drop_path_rate", 1.0, 0, 1, open_high=True)
    with pytest.raises(TypeError):
        number("hflip", True, 0, 1)


def test_grade_says_unanswered_wrong_with_the_hint_or_correct_and_never_stops_a_run(capsys):
    from convit_edu.checks import WrongAnswer, check_answer, grade

    def check_square(answer):
        check_answer(answer == 9, "three times three")

    assert grade("square", ..., check_square) == "not answered yet"
    assert grade("pair", (1, ...), lambda a: None) == "not answered yet"  # one name of two still a placeholder
    assert grade("square", 6, check_square) == "not yet: three times three"
    assert grade("square", 9, check_square) == "correct"
    assert capsys.readouterr().out.splitlines() == ["square: not answered yet", "pair: not answered yet",
                                                    "square: not yet: three times three", "square: correct"]
    with pytest.raises(ZeroDivisionError):  # an answer that crashes shows its own traceback
        grade("square", 0, lambda a: 1 / a)
    with pytest.raises(WrongAnswer):  # the check itself still raises, for `expect_error`
        check_square(6)


def test_demonstrate_labels_each_slip_with_its_hint_and_fails_on_an_answer_the_check_passes(capsys):
    from convit_edu.checks import check_answer, demonstrate

    def check_square(answer):
        check_answer(answer == 9, f"{answer} is not three times three")

    demonstrate(check_square, {"three plus three": 6, "three squared, squared": 81})
    assert capsys.readouterr().out.splitlines() == [
        "the check on known slips (a demonstration, not your answer):",
        "  three plus three -> not yet: 6 is not three times three",
        "  three squared, squared -> not yet: 81 is not three times three"]
    with pytest.raises(AssertionError, match="expected WrongAnswer, but the call returned None"):
        demonstrate(check_square, {"a right answer": 9})
    with pytest.raises(ZeroDivisionError):  # a check that crashes on a slip is no demonstration of a hint
        demonstrate(lambda answer: 1 / answer, {"zero": 0})
    with pytest.raises(ValueError, match="at least one wrong answer"):
        demonstrate(check_square, {})


@pytest.mark.parametrize("env, on", [({}, False), ({"CI": "true"}, False), ({"CONVIT_EDU_SOLUTIONS": "1"}, True),
                                     ({"CI": "true", "CONVIT_EDU_SOLUTIONS": "1"}, True),
                                     ({"CONVIT_EDU_SOLUTIONS": ""}, False), ({"CONVIT_EDU_SOLUTIONS": "0"}, False)])
def test_reference_answers_run_only_when_convit_edu_solutions_asks_and_only_when_unanswered(monkeypatch, env, on):
    """Answering the exercises is an explicit request: CI alone does not turn the reference answers on (its notebooks
    run as a student who typed them in, conftest.py), so neither does any environment that merely sets CI."""
    from convit_edu.checks import reveal, solutions_on

    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("CONVIT_EDU_SOLUTIONS", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert solutions_on() is on and reveal(...) is on
    assert reveal(lambda: None) is False and reveal((1, 2)) is False  # an answered exercise keeps its answer


def test_a_partial_answer_is_kept_not_replaced_by_the_reference(monkeypatch):
    from convit_edu.checks import reveal

    monkeypatch.setenv("CONVIT_EDU_SOLUTIONS", "1")
    assert reveal(..., ...) is True and reveal(3, ...) is False
