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
    with pytest.raises(ValueError, match=r"lr must be a finite number in \(0, inf\], got 0.0"):
        number("lr", 0.0, 0, open_low=True)
    with pytest.raises(ValueError, match="got inf"):
        number("lr", float("inf"), 0, open_low=True)
    with pytest.raises(ValueError, match=r"in \[0, 1\), got 1.0"):
        number("drop_path_rate", 1.0, 0, 1, open_high=True)
    with pytest.raises(TypeError):
        number("hflip", True, 0, 1)
