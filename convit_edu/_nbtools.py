"""Notebook tooling: pair, export, run and check the chapters in ``nbs/`` (the README's "Writing a chapter").

Usage::

    python -m convit_edu._nbtools sync   [NB ...]   # pair NN_x.py <-> NN_x.ipynb (the newer one wins)
    python -m convit_edu._nbtools export [NB ...]   # write the modules they export into (see ``_nbexport``)
    python -m convit_edu._nbtools run    [NB ...]   # execute notebooks in place (cwd nbs/, full mode), as a student
    python -m convit_edu._nbtools run --answers [NB ...]   # the same, every exercise answered by its reference
    python -m convit_edu._nbtools check             # what CI checks: pairs, clean runs, fresh exports

``NB`` may name ``nbs/01_self_attention``, its ``.py`` or its ``.ipynb``; without it, every notebook.
The authoring loop is: edit ``nbs/NN_x.py`` -> ``sync`` -> ``export`` -> ``run`` -> commit all three.
``sync`` is ``jupytext --sync`` with the pairing of ``[tool.jupytext]`` in pyproject.toml (a pair that already
agrees is left alone).

``check`` requires that a committed notebook's outputs come from one clean run of its current code: execution
counts 1..n without an error. What ties those outputs to the current code is ``sync``, the one way a cell's code
changes without a run: a code cell keeps its outputs and execution count only when its code, up to ``run_key``, is
the code that produced them (the cell that had that execution count before pairing); any other cell loses both,
and ``check`` asks for a run. ``run_key`` compares the program as Python parses it (so comments, the exporter's
``#| default_exp`` and layout do not count, for they change nothing a run prints) and ignores one thing more: the
modules of the top-level ``from MODULE import NAMES`` statements on lines of their own: they count by the set of
names they bring in. So a chapter whose import lines only follow a renamed module or a name moved to another
(``from convit_edu.fit import deit_lr`` -> ``from convit_edu.schedule import deit_lr``), or whose
``#| default_exp`` names the module anew, needs no new run, while a name or alias changed,
added or removed, a plain ``import MODULE``, a star import, an import beside other code on its line or inside a
function, ``if`` or ``try``, and any other change of what a cell runs still need one. (CI's nbval
re-runs every chapter, so an import that does not resolve still fails there.)
How the export cuts cells into modules is ``_nbexport``'s docstring. The exercises of a chapter (its cells tagged
``solution`` and the two before each) are read by ``exercises``; ``answered_notebook`` is the chapter as a student
who typed every reference answer into its answer cell, which CI runs (``conftest.py``).

These modules import jupytext, nbformat, nbclient and IPython lazily: ``import convit_edu`` never pulls them in.
"""

from __future__ import annotations

import argparse
import ast
import copy
import os
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

from convit_edu._nbexport import (
    CMD,
    GENERATED_MARK,
    PACKAGE,
    Imported,
    NbToolsError,
    export,
    notebook_stems,
    project_modules,
    read_py,
    rel,
    take_imports,
)

CELL_TIMEOUT_S = 1200
FAST_VALUES = ("1", "true", "yes", "on")  # as the parameters cell of every notebook reads them


@dataclass(frozen=True)
class Cell:
    """The parts of a cell that pairing compares: its type, source and tags."""

    cell_type: str
    source: str
    tags: tuple[str, ...]


# ---------------------------------------------------------------------------------------------- locating


def find_root(start: Path | None = None) -> Path:
    """The project root: the nearest folder at or above ``start`` holding ``pyproject.toml`` and ``nbs/``."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        if (d / "pyproject.toml").is_file() and (d / "nbs").is_dir():
            return d
    raise NbToolsError(f"no project root (a folder with pyproject.toml and nbs/) at or above {here}")




def resolve_stems(root: Path, names: list[str]) -> list[Path]:
    if not names:
        return notebook_stems(root)
    stems = []
    for name in names:
        p = Path(name)
        p = p if p.is_absolute() else Path.cwd() / p
        stem = p.with_suffix("") if p.suffix in (".py", ".ipynb") else p
        if not (stem.with_suffix(".py").exists() or stem.with_suffix(".ipynb").exists()):
            raise NbToolsError(f"no notebook {name!r}: expected {stem}.py or {stem}.ipynb")
        stems.append(stem.resolve())
    return stems




# ---------------------------------------------------------------------------------------------- pairing




def read_ipynb(path: Path):
    import nbformat

    return nbformat.read(path, as_version=4)


def cells_of(nb) -> list[Cell]:
    return [
        Cell(c.cell_type, c.source.strip("\n"), tuple(c.metadata.get("tags", ())))
        for c in nb.cells
    ]


def agree(py: Path, ipynb: Path) -> bool:
    """Whether both files of a pair exist and hold the same cells (``cells_of``)."""
    return py.exists() and ipynb.exists() and cells_of(read_py(py)) == cells_of(read_ipynb(ipynb))


def run_key(source: str) -> str:
    """A code cell's code as ``sync`` compares it with the code that produced the cell's outputs: the program IPython
    runs (a magic as the call it makes), as Python parses it, so comments and layout (``#| default_exp``, a
    rewrapped line) do not count; and the top-level ``from MODULE import NAMES`` statements (on lines of their own, as
    ``take_imports`` finds them) count by the set of names and aliases they bring in alone, so that a renamed module,
    or a name moved to another module (one statement become two), needs no new run. A
    plain ``import MODULE``, a star import, an import inside a function, ``if`` or ``try`` keep their module; code
    that does not parse counts as written."""
    from IPython.core.inputtransformer2 import TransformerManager

    code = TransformerManager().transform_cell(source)
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return code
    followed = [node for node in take_imports(tree, code)[0]
                if isinstance(node, ast.ImportFrom) and node.names[0].name != "*"]
    names = sorted({imported.spelled() for node in followed for imported in Imported.all_of(node)})
    tree.body = [node for node in tree.body if node not in followed]
    return f"from <any modules> import {', '.join(names)}\n{ast.unparse(tree)}" if names else ast.unparse(tree)


def keep_outputs_of_code_that_ran(ipynb: Path, ran) -> None:
    """Clear the outputs and execution count of each code cell of ``ipynb`` whose code is not, up to ``run_key``, the
    code that produced them: that of the cell of ``ran`` (the notebook before pairing) with the same execution count.
    Jupytext keeps the outputs of an edited cell; this is what makes ``check`` ask for a new run."""
    import nbformat

    nb = read_ipynb(ipynb)
    code_that_ran = {c.execution_count: run_key(c.source) for c in ran.cells
                     if c.cell_type == "code" and c.execution_count is not None}
    stale = [c for c in nb.cells if c.cell_type == "code" and (c.outputs or c.execution_count is not None)
             and code_that_ran.get(c.execution_count) != run_key(c.source)]
    for cell in stale:
        cell.outputs, cell.execution_count = [], None
    if stale:
        nbformat.write(nb, ipynb)


def sync(stem: Path) -> str | None:
    """Pair one notebook with ``jupytext --sync`` and the pairing of ``[tool.jupytext]`` in pyproject.toml: the newer
    file gives the cells, the .ipynb the outputs, which ``keep_outputs_of_code_that_ran`` keeps only where they
    came from the cell's code. Returns what was written (None when the pair already agreed)."""
    from jupytext.cli import jupytext

    py, ipynb = stem.with_suffix(".py"), stem.with_suffix(".ipynb")
    if agree(py, ipynb):
        return None
    ran = read_ipynb(ipynb) if ipynb.exists() else None
    if not py.exists():
        done = f"{py.name} <- {ipynb.name} (new)"
    elif ran is None:
        done = f"{py.name} -> {ipynb.name} (new)"
    elif ipynb.stat().st_mtime > py.stat().st_mtime:  # jupytext's rule: the newer file gives the cells
        done = f"{py.name} <- {ipynb.name} (the .ipynb was newer)"
    else:
        done = f"{py.name} -> {ipynb.name}"
    if jupytext(["--sync", "--quiet", str(py if py.exists() else ipynb)]) != 0 or not agree(py, ipynb):
        raise NbToolsError(f"`jupytext --sync` did not pair {stem.name}: does pyproject.toml's [tool.jupytext] say "
                           "formats = \"ipynb,py:percent\"?")
    if ran is not None:
        keep_outputs_of_code_that_ran(ipynb, ran)
    return done


# ---------------------------------------------------------------------------------------------- run


def run(stem: Path, root: Path, answers: bool = False) -> None:
    """Execute a notebook in place with nbclient, cwd ``nbs/``, no timing metadata.

    Full mode unless ``CONVIT_EDU_FAST`` is set; the exercises left to the student (``CONVIT_EDU_SOLUTIONS=0``)
    unless ``answers``, which answers each by its reference answer (``CONVIT_EDU_SOLUTIONS=1``). Committed outputs
    come from a student's run; both settings are recorded in the notebook's metadata so ``check`` can tell.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    env = {**os.environ, "CONVIT_EDU_FAST": os.environ.get("CONVIT_EDU_FAST", "0"),
           "CONVIT_EDU_SOLUTIONS": "1" if answers else "0"}
    ipynb = stem.with_suffix(".ipynb")
    if not ipynb.exists():
        raise NbToolsError(f"{rel(ipynb, root)} does not exist: run `{CMD} sync {rel(stem, root)}.py` first")
    nb = read_ipynb(ipynb)
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(root / "nbs")}},
    )
    try:
        client.execute(env=env)
    except CellExecutionError as e:
        raise NbToolsError(f"{rel(ipynb, root)} failed (not saved):\n{e}") from None
    nb.metadata["convit_edu"] = {"fast": env["CONVIT_EDU_FAST"].strip().lower() in FAST_VALUES, "solutions": answers}
    nbformat.write(nb, ipynb)


# ---------------------------------------------------------------------------------------------- exercises


REVEAL = re.compile(r"if reveal\((\w+(?:, \w+)*)\):")
WATCH_HINTS = """\
# (added by CI: each hint a check gives to a wrong answer is recorded, to see that every one can be reached)
import sys as _sys

import convit_edu.checks as _checks

_hints_given, _check_answer = set(), _checks.check_answer


def _watched_check_answer(correct, hint):
    if not correct:
        caller = _sys._getframe(1)
        _hints_given.add((caller.f_code.co_name, caller.f_lineno - caller.f_code.co_firstlineno))
    return _check_answer(correct, hint)


_checks.check_answer = _watched_check_answer
"""


@dataclass(frozen=True)
class Exercise:
    """One exercise of a chapter: the indices in ``nb.cells`` of its answer cell, its check cell and its reference
    cell (the cell tagged ``solution``, two after the answer cell), the names it asks for, and the reference answer
    as the code a student would type into the answer cell (the reference cell's body without its ``grade`` calls)."""

    answer: int
    check: int
    reference: int
    names: tuple[str, ...]
    answer_code: str

    @property
    def label(self) -> str:
        """The name ``grade`` prints the verdict under: the names, comma-separated."""
        return ", ".join(self.names)

    @property
    def placeholder(self) -> re.Pattern:
        """The answer cell's line that a student replaces: ``NAMES = ..., ...  # your answer: ...``."""
        dots = ", ".join(["\\.\\.\\."] * len(self.names))
        return re.compile(rf"(?m)^{re.escape(self.label)} = {dots}  # your answer: .*$")


def _is_grade_call(node: ast.stmt) -> bool:
    call = node.value if isinstance(node, ast.Expr) else None
    return isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "grade"


def exercises(nb, where: str = "the notebook") -> list[Exercise]:
    """The exercises of a notebook, in order; an ``NbToolsError`` naming the cell when one is not shaped as the
    chapters' exercises are (answer cell, check cell, reference cell that starts with ``if reveal(NAMES):``)."""
    found = []
    for i, cell in enumerate(nb.cells):
        if "solution" not in cell.metadata.get("tags", ()):
            continue
        first, _, body = cell.source.partition("\n")
        match = REVEAL.match(first)
        if not match or i < 2 or any(nb.cells[j].cell_type != "code" for j in (i - 2, i - 1)):
            raise NbToolsError(f"{where}, cell {i}: a reference answer starts with `if reveal(NAMES):` and follows "
                               "the answer cell and the check cell")
        body = textwrap.dedent(body)
        lines = body.splitlines()
        for node in reversed(ast.parse(body).body):
            if _is_grade_call(node):
                del lines[node.lineno - 1 : node.end_lineno]
        names = tuple(match.group(1).split(", "))
        found.append(Exercise(i - 2, i - 1, i, names, "\n".join(lines).strip("\n")))
    return found


def hint_sites(source: str) -> dict[tuple[str, int], str]:
    """Every ``check_answer(...)`` call of a check cell, by (the function it is in, its line counted from that
    function's first line) — what ``WATCH_HINTS`` records when it gives a hint — with its first source line."""
    sites, lines = {}, source.splitlines()

    def visit(node: ast.AST, function: ast.AST | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) else function
            if (isinstance(child, ast.Call) and isinstance(child.func, ast.Name) and child.func.id == "check_answer"
                    and function is not None):
                first = min([function.lineno, *(d.lineno for d in getattr(function, "decorator_list", []))])
                sites[(getattr(function, "name", "<lambda>"), child.lineno - first)] = lines[child.lineno - 1].strip()
            visit(child, inner)

    visit(ast.parse(source), None)
    return sites


def answered_notebook(nb, where: str = "the notebook"):
    """A copy of ``nb`` as a student runs it who typed every reference answer into its answer cell, with the outputs
    that run must reproduce: the committed outputs (a student's run: every check said ``not answered yet``), each
    check saying ``correct`` instead; the answer cells' outputs are not compared. A first cell records every hint a
    check gives, and a last cell fails unless each ``check_answer`` of the check cells gave its hint at least once
    (to one of the slips the check is shown on)."""
    import nbformat

    nb, sites = copy.deepcopy(nb), {}
    for ex in exercises(nb, where):
        answer, check = nb.cells[ex.answer], nb.cells[ex.check]
        answer.source, typed = ex.placeholder.subn(lambda _: ex.answer_code, answer.source)
        if typed != 1:
            raise NbToolsError(f"{where}, cell {ex.answer}: no line `{ex.label} = ...  # your answer: ...` to answer")
        answer.outputs = []
        answer.metadata["tags"] = [*answer.metadata.get("tags", []), "nbval-ignore-output"]
        unanswered, correct = f"{ex.label}: not answered yet\n", f"{ex.label}: correct\n"
        streams = [o for o in check.outputs if o.get("output_type") == "stream" and unanswered in o.get("text", "")]
        if len(streams) != 1:
            raise NbToolsError(f"{where}, cell {ex.check}: the committed check of {ex.label!r} does not say "
                               f"'not answered yet' once: commit a student's run, `{CMD} run`")
        streams[0]["text"] = streams[0]["text"].replace(unanswered, correct)
        for key, line in hint_sites(check.source).items():
            if key in sites:
                raise NbToolsError(f"{where}: two check functions named {key[0]!r} give hints: name them apart")
            sites[key] = f"cell {ex.check}: {key[0]}: {line}"
    if sites:
        reached = f"""\
# (added by CI: every hint of every check above was given to some slip of the demonstrations)
_sites = {sites!r}
_missing = [where for key, where in _sites.items() if key not in _hints_given]
assert not _missing, "hints no demonstrated slip reaches: " + "; ".join(_missing)"""
        nb.cells.insert(0, nbformat.v4.new_code_cell(WATCH_HINTS))
        nb.cells.append(nbformat.v4.new_code_cell(reached))
    return nb


# ---------------------------------------------------------------------------------------------- check


def pairing_problem(stem: Path, root: Path) -> str | None:
    """What is wrong with a notebook's pair (a file missing, or the two differing), or None."""
    py, ipynb = stem.with_suffix(".py"), stem.with_suffix(".ipynb")
    name = rel(stem, root)
    if not py.exists():
        return f"{name}.ipynb has no paired .py: run `{CMD} sync {name}.ipynb`"
    if not ipynb.exists():
        return f"{name}.py has no paired .ipynb: run `{CMD} sync {name}.py`, then `run` it"
    if not agree(py, ipynb):
        return (f"{name}.py and {name}.ipynb differ: run `{CMD} sync {name}.py`, `{CMD} export` and "
                f"`{CMD} run {name}.ipynb`")
    return None


def check_notebook(stem: Path, root: Path) -> list[str]:
    """What is wrong with a notebook whose pair is in order: not one clean run, or a FAST run's outputs."""
    name, nb = rel(stem, root), read_ipynb(stem.with_suffix(".ipynb"))
    problems = []
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    errors = [
        o.get("ename", "error")
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.get("output_type") == "error"
    ]
    if counts != list(range(1, len(counts) + 1)) or errors:
        problems.append(
            f"{name}.ipynb was not executed in one clean run (execution counts {counts[:12]}"
            f"{'...' if len(counts) > 12 else ''}{', errors ' + str(errors) if errors else ''}): "
            f"run `{CMD} run {name}.ipynb`"
        )
    elif nb.metadata.get("convit_edu", {}).get("fast", False):
        problems.append(
            f"{name}.ipynb holds outputs of a FAST run; commit a full run: "
            f"`CONVIT_EDU_FAST=0 {CMD} run {name}.ipynb`"
        )
    elif answered := answered_outputs(nb, name):
        problems.append(
            f"{name}.ipynb shows the answers of {answered}: commit a student's run, which leaves the exercises to the "
            f"student: `{CMD} run {name}.ipynb` (without --answers)"
        )
    return problems


def answered_outputs(nb, name: str) -> str:
    """Which exercises a committed notebook shows answered ("" when none): each whose reference cell has an output
    (it ran: a run with ``--answers``) or whose check does not say ``not answered yet``."""
    shown = []
    for ex in exercises(nb, f"{name}.ipynb"):
        text = "".join(o.get("text", "") for o in nb.cells[ex.check].outputs if o.get("output_type") == "stream")
        if nb.cells[ex.reference].outputs or f"{ex.label}: not answered yet\n" not in text:
            shown.append(repr(ex.label))
    return ", ".join(shown)


def check(root: Path) -> list[str]:
    """Every problem that would make CI fail, each with the command that fixes it; [] when clean."""
    problems, unpaired = [], set()
    for stem in notebook_stems(root):
        pairing = pairing_problem(stem, root)
        try:
            problems += [pairing] if pairing else check_notebook(stem, root)
        except NbToolsError as e:  # an exercise not shaped as the chapters' are
            problems.append(str(e))
        unpaired |= {rel(stem.with_suffix(".py"), root)} if pairing else set()
    try:
        modules = project_modules(root)
    except NbToolsError as e:
        return problems + [str(e)]
    for module, parts in modules.items():
        target = root / PACKAGE / f"{module}.py"
        if unpaired & set(parts.sources):
            continue  # its notebook's pair comes first (sync, then export)
        if not target.exists() or target.read_text() != parts.text(module):
            problems.append(f"convit_edu/{module}.py differs from a fresh export of {', '.join(parts.sources)}: "
                            f"run `{CMD} export`")
    for module in sorted((root / PACKAGE).glob("*.py")):
        head = module.read_text().split("\n", 4)[:4]
        if any(line.startswith(GENERATED_MARK) for line in head) and module.stem not in modules:
            problems.append(
                f"convit_edu/{module.name} was generated from a notebook that no longer exports it: "
                "delete it or restore its notebook"
            )
    return problems


# ---------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=CMD, description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["sync", "export", "run", "check"])
    parser.add_argument("notebooks", nargs="*", help="notebooks (default: all in nbs/)")
    parser.add_argument("--answers", action="store_true",
                        help="run: answer every exercise by its reference answer (CONVIT_EDU_SOLUTIONS=1)")
    args = parser.parse_args(argv)
    if args.answers and args.command != "run":
        parser.error("--answers is an option of run")
    try:
        root = find_root()
        if args.command == "check":
            if args.notebooks:
                parser.error("check takes no notebooks: it checks the whole project")
            problems = check(root)
            for p in problems:
                print(f"FAIL {p}")
            print(f"{len(problems)} problem(s) in {len(notebook_stems(root))} notebook(s)")
            return 1 if problems else 0
        modules = project_modules(root) if args.command == "export" else None  # every chapter read first
        for stem in resolve_stems(root, args.notebooks):
            if args.command == "sync":
                done = sync(stem)
                print(done or f"{stem.name}: in sync")
            elif args.command == "export":
                targets = export(stem, root, modules)
                written = ", ".join(rel(t, root) for t in targets)
                print(f"{stem.name}.py -> {written}" if targets else f"{stem.name}: exports nothing")
            else:
                print(f"running {rel(stem, root)}.ipynb{' with the reference answers' if args.answers else ''} ...",
                      flush=True)
                run(stem, root, answers=args.answers)
        return 0
    except NbToolsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
