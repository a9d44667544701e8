"""A chapter's exercises as a student meets them and as CI runs them: unanswered, every check says so and "Run all"
goes on; with the reference answers (CONVIT_EDU_SOLUTIONS, or CI), every check says correct."""

import os
import re
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "nbs" / "01_self_attention.ipynb"
EXERCISES = ["masked_attention", "split_heads", "MyMHSA"]


def verdicts(solutions: str) -> list[tuple[str, str]]:
    nb = nbformat.read(CHAPTER, as_version=4)
    env = {**os.environ, "CONVIT_EDU_FAST": "1", "CONVIT_EDU_SOLUTIONS": solutions}
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT / "nbs")}}).execute(env=env)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    return re.findall(r"^(\w+): (not answered yet|correct|not yet: .*)$", text, re.M)


def test_unanswered_exercises_say_so_and_the_chapter_runs_to_its_end():
    assert verdicts("0") == [(name, "not answered yet") for name in EXERCISES]


def test_with_the_reference_answers_every_check_says_correct():
    assert verdicts("1") == [(name, v) for name in EXERCISES for v in ("not answered yet", "correct")]
