"""The chapters' exercises, read as a student meets them: the shape of each (answer cell, check cell, reference
answer), what a check may read, how a failing check is shown; and the run CI makes of every chapter with exercises
(`conftest.py`, `convit_edu._nbtools.answered_notebook`), tried on a toy chapter whose faults it must catch."""

import ast
import builtins
import os
import re
import symtable
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from convit_edu import _nbtools as nbt

ROOT = Path(__file__).resolve().parents[1]


def core_chapters() -> list[str]:
    """The core path, as the index's map lists it (nbs/00_index.py, `CORE`)."""
    text = (ROOT / "nbs" / "00_index.py").read_text()
    return re.findall(r'^\s+\("(\d\d_\w+)",', text[text.index("CORE = [") : text.index("ENGINEERING = [")], re.M)


def chapter(stem: str):
    return nbformat.read(ROOT / "nbs" / f"{stem}.ipynb", as_version=4)


def bound_names(source: str) -> set[str]:
    """The names a cell binds at its top level (definitions, assignments, imports, loop and `with` targets)."""
    names = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(child.name)
                continue  # what a function binds is its own
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                names.update((a.asname or a.name).split(".")[0] for a in child.names)
            elif isinstance(child, ast.Name) and isinstance(child.ctx, ast.Store):
                names.add(child.id)
            if not isinstance(child, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
                visit(child)

    visit(ast.parse(source))
    return names


def global_reads(source: str) -> set[str]:
    """Every name a cell reads from the notebook's namespace: at its top level, or in its functions, lambdas and
    comprehensions where the name is not their own (`symtable` says which)."""
    found, tables = set(), [symtable.symtable(source, "<cell>", "exec")]
    while tables:
        table = tables.pop()
        top = table.get_type() == "module"
        found |= {s.get_name() for s in table.get_symbols() if s.is_referenced() and (top or s.is_global())}
        tables += table.get_children()
    return found


def python_code(nb) -> dict[int, str]:
    """The code cells' sources by index, `%magic` lines blanked (they are IPython's, not Python's)."""
    return {i: re.sub(r"(?m)^\s*%.*$", "", c.source) for i, c in enumerate(nb.cells) if c.cell_type == "code"}


def reads_of_reference_names(nb, where: str) -> dict[int, list[str]]:
    """The cells (by index) that read a name which only a reference answer defines, with those names."""
    references = {ex.reference for ex in nbt.exercises(nb, where)}
    code = python_code(nb)
    outside = set().union(*(bound_names(s) for i, s in code.items() if i not in references))
    only_in_answers = set().union(*(bound_names(code[i]) for i in references)) - outside - set(dir(builtins))
    readers = {i: sorted(global_reads(s) & only_in_answers) for i, s in code.items() if i not in references}
    return {i: names for i, names in readers.items() if names}


@pytest.mark.parametrize("stem", core_chapters())
def test_no_check_reads_a_name_that_only_a_reference_answer_defines(stem):
    """A correct answer typed into the answer cell must not crash its check (course review 2, X1: chapter 36's check
    read `json` and `Path`, imported only by its reference answer, which CI used to run first). The answered run
    cannot see this (the reference answer, typed in, imports them): it is read from the cells."""
    assert reads_of_reference_names(chapter(stem), stem) == {}, f"{stem}: cells read what only an answer defines"


@pytest.mark.parametrize("stem", core_chapters())
def test_a_reference_answer_reads_nothing_its_check_cell_or_a_later_cell_defines(stem):
    """Typed into the answer cell, which runs before its check, a reference answer must not need the check's names
    (a demonstration of the check left in the reference cell would: it belongs to the check cell, `demonstrate`)."""
    nb = chapter(stem)
    code = python_code(nb).items()
    for ex in nbt.exercises(nb, stem):
        before = set().union(*(bound_names(s) for i, s in code if i < ex.answer))
        after = set().union(*(bound_names(s) for i, s in code if i > ex.answer)) - before
        needed = sorted(global_reads(ex.answer_code) & after - bound_names(ex.answer_code))
        assert not needed, f"{stem}: the reference answer of {ex.label!r} reads {needed}, defined only after its cell"


@pytest.mark.parametrize("stem", core_chapters())
def test_a_check_cell_reads_the_students_answer_only_to_grade_it(stem):
    """A check that called the student's function elsewhere (to build a wrong answer from it, say) would run the
    student's code where the hint does not expect it, and the placeholder `...` where no answer was typed."""
    nb = chapter(stem)
    for ex in nbt.exercises(nb, stem):
        tree = ast.parse(nb.cells[ex.check].source)
        for call in ast.walk(tree):
            if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "grade":
                call.args[1] = ast.Constant(None)  # the graded answer: the one read allowed
        stray = sorted(global_reads(ast.unparse(tree)) & set(ex.names))
        assert not stray, f"{stem}: the check of {ex.label!r} reads {stray} outside grade(...)"


@pytest.mark.parametrize("stem", core_chapters())
def test_every_failing_check_is_shown_labelled_as_a_demonstration(stem):
    """Under the student's verdict a check is shown on named slips by `demonstrate`, which says it is a demonstration
    (course review 2, X5: a bare `WrongAnswer: ...` line read as if the student's own answer had failed)."""
    nb = chapter(stem)
    found = nbt.exercises(nb, stem)
    assert 2 <= len(found) <= 4, f"{stem}: {len(found)} exercises, the course wants 2 to 4"
    for ex in found:
        source = nb.cells[ex.check].source
        assert "demonstrate(" in source, f"{stem}: the check of {ex.label!r} is not shown on any slip"
        assert not re.search(r"expect_error\(\s*lambda[^:]*:\s*check_", source), (
            f"{stem}: the check of {ex.label!r} is shown failing without the label of a demonstration")


@pytest.mark.parametrize("stem", core_chapters())
def test_every_exercise_has_a_placeholder_a_graded_check_and_its_reference_answer_after_the_check(stem):
    """The student's answer cell holds `NAME = ...`; the check cell below it grades NAME (so "Run all" prints `not
    answered yet` and goes on); the reference answer comes after the check, collapsed, and runs only through
    `reveal` (CONVIT_EDU_SOLUTIONS)."""
    nb = chapter(stem)
    found = nbt.exercises(nb, stem)
    assert found, f"{stem}: no exercises"
    for ex in found:
        assert ex.placeholder.search(nb.cells[ex.answer].source), f"{stem}: no `{ex.label} = ...` line to answer"
        assert f'grade("{ex.label}", ' in nb.cells[ex.check].source, f"{stem}: the check does not grade {ex.label}"
        reference = nb.cells[ex.reference]
        assert reference.metadata.get("jupyter", {}).get("source_hidden"), f"{stem}: {ex.label}'s answer shows"
        assert f'grade("{ex.label}", ' in reference.source, f"{stem}: the reference answer {ex.label} is not graded"
        assert ex.answer_code and "grade(" not in ex.answer_code


# ---------------------------------------------------------------------------------------------- the answered run

TOY = {
    "answer": "square = ...  # your answer: def square(x): ...",
    "check": '''\
from convit_edu.checks import check_answer, demonstrate, grade, reveal


def check_square(fn) -> None:
    check_answer(callable(fn), "a function of x")
    check_answer(fn(3) == 9, f"square(3) is {fn(3)}: multiply x by itself")


grade("square", square, check_square)
demonstrate(check_square, {"x + x": lambda x: x + x, "a number": 9})''',
    "reference": '''\
if reveal(square):  # a reference answer
    def square(x):
        return x * x

    grade("square", square, check_square)''',
}


def toy_chapter(**changes: str):
    """A toy chapter with one exercise (its check cell as a student's run leaves it), some cells replaced."""
    cells = {**TOY, **changes}
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import math"), nbformat.v4.new_code_cell(cells["answer"]),
                nbformat.v4.new_code_cell(cells["check"]), nbformat.v4.new_code_cell(cells["reference"])]
    nb.cells[3].metadata.update(tags=["solution"], jupyter={"source_hidden": True})
    nb.cells[2].outputs = [nbformat.v4.new_output("stream", name="stdout", text="square: not answered yet\n")]
    return nb


def run_answered(nb):
    """Execute `answered_notebook(nb)` as CI does (reference answers off); the run notebook."""
    answered = nbt.answered_notebook(nb, "toy")
    env = {**os.environ, "CONVIT_EDU_SOLUTIONS": "0"}
    NotebookClient(answered, timeout=120, kernel_name="python3").execute(env=env)
    return answered


def stdout(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")


def test_the_answered_run_types_the_reference_answer_into_the_answer_cell_and_expects_correct():
    answered = nbt.answered_notebook(toy_chapter(), "toy")
    watch, *cells, reached = answered.cells
    assert cells[1].source == "def square(x):\n    return x * x"  # the reference answer, without its grade(...)
    assert "nbval-ignore-output" in cells[1].metadata.tags
    assert stdout(cells[2]) == "square: correct\n"  # what the committed "not answered yet" must become
    assert "_hints_given" in watch.source and "_missing" in reached.source


def test_the_answer_replaces_the_placeholder_line_and_keeps_the_rest_of_the_answer_cell():
    nb = toy_chapter(answer="BASE = 3\n" + TOY["answer"] + "\nprint(BASE)")
    assert nbt.answered_notebook(nb, "toy").cells[2].source == "BASE = 3\ndef square(x):\n    return x * x\nprint(BASE)"


def test_a_correct_answer_typed_into_the_answer_cell_is_graded_correct_and_every_hint_is_reached():
    run = run_answered(toy_chapter())
    check = stdout(run.cells[3])
    assert check.startswith("square: correct\nthe check on known slips (a demonstration, not your answer):\n")
    assert "  x + x -> not yet: square(3) is 6: multiply x by itself\n" in check
    assert "  a number -> not yet: a function of x\n" in check
    assert stdout(run.cells[4]) == ""  # the reference cell: answered, so it does not run


def test_a_check_that_reads_a_name_only_the_reference_answer_defines_is_found():
    check = TOY["check"].replace("fn(3) == 9", "fn(3) == json.loads('9')")
    reference = TOY["reference"].replace("    def square", "    import json\n\n    def square")
    assert reads_of_reference_names(toy_chapter(check=check, reference=reference), "toy") == {2: ["json"]}
    assert reads_of_reference_names(toy_chapter(), "toy") == {}


def test_the_answered_run_fails_when_no_demonstrated_slip_reaches_a_hint():
    check = TOY["check"].replace('"a number": 9', '"x + 1": lambda x: x + 1')  # never a non-function
    with pytest.raises(CellExecutionError, match=r"hints no demonstrated slip reaches: cell 2: check_square: "
                                                 r'check_answer\(callable\(fn\), "a function of x"\)'):
        run_answered(toy_chapter(check=check))


def test_the_answered_run_needs_the_committed_check_to_say_not_answered_yet():
    nb = toy_chapter()
    nb.cells[2].outputs[0]["text"] = "square: correct\n"  # a notebook committed with its answers
    with pytest.raises(nbt.NbToolsError, match="does not say 'not answered yet' once: commit a student's run"):
        nbt.answered_notebook(nb, "toy")


def test_a_reference_answer_not_shaped_as_the_chapters_are_is_refused():
    nb = toy_chapter(reference=TOY["reference"].replace("if reveal(square):", "if True:"))
    with pytest.raises(nbt.NbToolsError, match="cell 3: a reference answer starts with `if reveal"):
        nbt.exercises(nb, "toy")
