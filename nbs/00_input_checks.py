# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Checks: bad input refused early, and the exercises' verdicts
#
# The index, chapter 00_index, put the paper on one page, mapped the course and said how to run, test and write a
# chapter. Every chapter after it checks two things with the tools of this one, the module `convit_edu.checks`: the
# input of the package's functions, refused before any work with a message that names the wrong value, and the
# reader's answers to its exercises, graded with a hint rather than the answer. This chapter builds both and shows
# them at work.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %% [markdown]
# ## Bad input, refused early and shown honestly
#
# Every function of the package checks its input before any work and raises an error that names the wrong value and what
# would be right; the checks that recur (a positive integer, a number in a range, a name from a known list) live in one
# small module, `convit_edu.checks`, which this chapter exports. Chapters also *show* what a wrong input does. A cell
# that only printed an error inside `try … except` would pass silently the day the check disappeared, so every chapter
# calls `expect_error`: it returns the message of the expected error and fails the cell when no error, or another kind
# of error, comes.

# %%
#| default_exp checks
# The checks every chapter shares: refuse bad input early, naming the value (``positive_int``, ``number``,
# ``one_of``), and show that a chapter's bad-input example really fails (``expect_error``).

# %%
#| export
import math
import numbers
import operator
import os
from collections.abc import Callable, Iterable


def positive_int(name: str, value: object, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum``, or a TypeError / ValueError naming ``name`` and the bad value.

    Accepts Python and NumPy integers (anything with ``__index__``); refuses floats, strings and booleans."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {value!r}") from None
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")
    return value


def number(name: str, value: object, low: float = -math.inf, high: float = math.inf, *,
           open_low: bool = False, open_high: bool = False) -> float:
    """``value`` as a finite float in the interval from ``low`` to ``high`` (ends open when asked), or a TypeError /
    ValueError naming ``name``, the interval and the bad value. A string such as "1e-3" (what a YAML file gives)
    is refused with a hint, not converted behind the user's back."""
    if isinstance(value, (bool, str)) or not isinstance(value, numbers.Real):
        hint = " (write the number without quotes)" if isinstance(value, str) else ""
        raise TypeError(f"{name} must be a number, got {value!r}{hint}")
    value = float(value)
    interval = (f"{'(' if open_low or low == -math.inf else '['}{low:g}, "  # an infinite end is never in it
                f"{high:g}{')' if open_high or high == math.inf else ']'}")
    inside = (low < value if open_low else low <= value) and (value < high if open_high else value <= high)
    if not (math.isfinite(value) and inside):
        raise ValueError(f"{name} must be a finite number in {interval}, got {value!r}")
    return value


def one_of(what: str, value: object, choices: Iterable[object]) -> object:
    """``value`` if it is one of ``choices``, else a ValueError that names it and lists the choices."""
    choices = list(choices)
    if value not in choices:
        raise ValueError(f"unknown {what} {value!r}: choose one of {', '.join(map(str, choices))}")
    return value


def expect_error(call: Callable[[], object], *kinds: type[BaseException]) -> str:
    """Call ``call()`` and return ``"Kind: message"`` of the error it raises; fail if none of ``kinds`` comes.

    ``kinds`` defaults to ``ValueError``. A chapter prints the returned text, so a reader sees the message a user
    gets, and the cell fails (``AssertionError``) when the input is accepted or a different exception escapes."""
    kinds = kinds or (ValueError,)
    try:
        result = call()
    except kinds as e:
        return f"{type(e).__name__}: {e}"
    names = " or ".join(k.__name__ for k in kinds)
    raise AssertionError(f"expected {names}, but the call returned {result!r:.80}")


# %%
print(expect_error(lambda: positive_int("depth", 0)))
print(expect_error(lambda: positive_int("epochs", 2.5), TypeError))
print(expect_error(lambda: one_of("model", "convit_huge", ["convit_tiny", "deit_tiny"])))
print(expect_error(lambda: number("lr", "1e-3"), TypeError))
print(expect_error(lambda: number("drop_path_rate", 1.0, 0, 1, open_high=True)))
assert number("lr", 5e-4, 0, open_low=True) == 5e-4 and number("fraction", 1, 0, 1, open_low=True) == 1.0
assert positive_int("num_workers", 0, minimum=0) == 0 and one_of("model", "deit_tiny", ["deit_tiny"]) == "deit_tiny"
print(expect_error(lambda: int("twelve")))
print(expect_error(lambda: {}["key"], KeyError))
assert expect_error(lambda: expect_error(lambda: 12), AssertionError) == (
    "AssertionError: expected ValueError, but the call returned 12")

# %% [markdown]
# ## Exercises
#
# The core chapters end with a few exercises. Each has an answer cell that defines the answer's name with the
# placeholder `...` (`masked_attention = ...`): replace it with your answer and run it. The check cell below it
# prints `not answered yet` while the placeholder is there, a hint when your answer is wrong (what to look at, never
# the answer), and `correct` when it is right; it never stops "Run all". Under your verdict it shows the check on the
# commonest slips, labelled as a demonstration, not your answer: each slip with the hint it gets, so you see what the
# check looks for, and a check that could not fail would break CI. A reference answer sits in the collapsed cell after
# the check. It runs only when you ask for it, with the variable `CONVIT_EDU_SOLUTIONS=1`
# (`python -m convit_edu._nbtools run --answers` sets it), and only for an exercise you have not answered: "Run all"
# leaves every exercise to you, and so do the committed notebooks, which come from such a run. CI types each
# reference answer into its answer cell and runs the chapter, so every reference answer is proved correct where
# yours will be graded.
#
# The `.py` file of a chapter is its source, reference answers included, in plain text; read a chapter in its
# `.ipynb`, where they are collapsed. An exercise that asks you to build something comes before the chapter shows its
# own version, and its check compares yours with what the chapter has built before it or with the package's version
# (your `MyMHSA` of chapter 01 with the Eq. 2-3 function built just above it, before the chapter shows `MHSA`). What
# you write stays in your notebook: the chapters after it use the package's version (the models of chapter 09 are
# built of `MHSA`, not of your `MyMHSA`).

# %%
#| export
class WrongAnswer(AssertionError):
    """An exercise's answer failed its check; the message is a hint, not the answer."""


def check_answer(correct: bool, hint: str) -> None:
    """The verdict of an exercise's check: nothing when ``correct``, else ``WrongAnswer(hint)``."""
    if not correct:
        raise WrongAnswer(hint)


def solutions_on() -> bool:
    """Whether the reference answers run: only when ``CONVIT_EDU_SOLUTIONS`` is set to a true value, an explicit
    request (``python -m convit_edu._nbtools run --answers``). ``CI`` does not turn them on: CI runs the chapters as a
    student who typed the reference answers into the answer cells (``conftest.py``)."""
    return os.environ.get("CONVIT_EDU_SOLUTIONS", "").strip().lower() in ("1", "true", "yes", "on")


def unanswered(answer: object) -> bool:
    """Whether ``answer`` is still the placeholder ``...`` (for several names, a tuple holding one)."""
    return answer is ... or (isinstance(answer, tuple) and any(part is ... for part in answer))


def reveal(*answers: object) -> bool:
    """Whether a reference answer should run now: solutions are on and the student has answered none of
    ``answers`` (a partial answer is kept, and graded as not answered yet)."""
    return solutions_on() and all(unanswered(a) for a in answers)


def grade(name: str, answer: object, check: Callable[[object], None]) -> str:
    """Print and return the verdict on exercise ``name``: "not answered yet" while ``answer`` is the placeholder,
    "not yet: HINT" when ``check(answer)`` raises ``WrongAnswer(HINT)``, else "correct". A wrong answer does not
    raise, so "Run all" goes on; an answer that crashes does, with its own traceback."""
    if unanswered(answer):
        verdict = "not answered yet"
    else:
        try:
            check(answer)
            verdict = "correct"
        except WrongAnswer as e:
            verdict = f"not yet: {e}"
    print(f"{name}: {verdict}")
    return verdict


def demonstrate(check: Callable[[object], None], slips: dict[str, object]) -> None:
    """Show ``check`` on known wrong answers, each named by the slip it makes (``{"the mask after the softmax":
    answer, ...}``), under a label that says they are a demonstration, not the student's answer: each slip with the
    hint it gets. Fails (``AssertionError``) when the check passes one of them, or fails it without a hint."""
    if not slips:
        raise ValueError("demonstrate needs at least one wrong answer, named by its slip")
    print("the check on known slips (a demonstration, not your answer):")
    for slip, wrong in slips.items():
        hint = expect_error(lambda: check(wrong), WrongAnswer).removeprefix("WrongAnswer: ")
        print(f"  {slip} -> not yet: {hint}")


# %% [markdown]
# A check in the style of the chapters: how many distinct offsets (δ1, δ2) separate two patches of a 14 × 14
# grid? (Chapter 02 counts them for PSA: 27 in each direction.) Graded three times: unanswered, with an answer that
# forgets that an offset can be negative (the hint), and right; then shown on two slips, as every check cell does.

# %%
def check_offsets(answer: int) -> None:
    check_answer(isinstance(answer, int), f"count the offsets: a whole number, got {answer!r}")
    offsets = {(qi - ki, qj - kj) for qi in range(14) for qj in range(14) for ki in range(14) for kj in range(14)}
    check_answer(answer == len(offsets), "an offset runs from -(14 - 1) to 14 - 1 in each of the two directions")


verdicts = [grade("offsets", answer, check_offsets) for answer in (..., 14 * 14, 27**2)]  # unanswered, wrong, right
assert verdicts[0] == "not answered yet" and verdicts[1].startswith("not yet: ") and verdicts[2] == "correct"
demonstrate(check_offsets, {"offsets from 0 to 13 only (14 x 14)": 14 * 14, "the answer as a float": 729.0})
print(expect_error(lambda: demonstrate(check_offsets, {"a right answer": 27**2}), AssertionError))
