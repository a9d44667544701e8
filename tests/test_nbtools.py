"""The notebook tooling: export, pairing, running and the `check` that CI relies on."""

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from convit_edu import _nbexport as nbe
from convit_edu import _nbtools as nbt

HEADER = (Path(__file__).resolve().parents[1] / "nbs" / "00_index.py").read_text().split("# %%")[0]
PYPROJECT = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
JUPYTEXT_SETTINGS = "[tool.jupytext]" + PYPROJECT.split("[tool.jupytext]")[1].split("\n[")[0]  # the project's pairing

SOURCE = HEADER + '''# %% [markdown]
# # Toy chapter

# %% tags=["parameters"]
FAST = False

# %%
#| default_exp toy

# %%
#| export
import math


def circle_area(r: float) -> float:
    """Area of a circle."""
    return math.pi * _square(r)


SCALE: float = 2.0

# %%
#| exporti
def _square(x):
    return x * x


def helper_not_public(x):
    return x

# %%
print(f"{circle_area(1.0):.4f}")
'''


def make_project(tmp_path: Path, source: str = SOURCE) -> Path:
    """A minimal project tree: pyproject.toml (with the project's pairing settings), nbs/01_toy.py and an empty
    package folder."""
    (tmp_path / "pyproject.toml").write_text(f"[project]\nname = 'toy'\n\n{JUPYTEXT_SETTINGS}")
    (tmp_path / "nbs").mkdir()
    (tmp_path / "convit_edu").mkdir()
    (tmp_path / "nbs" / "01_toy.py").write_text(source)
    return tmp_path


def fake_clean_run(ipynb: Path, fast: bool = False) -> None:
    """Number the code cells 1..n as one clean kernel run would (without starting a kernel)."""
    nb = nbformat.read(ipynb, as_version=4)
    n = 0
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.strip():
            n += 1
            cell.execution_count = n
    nb.metadata["convit_edu"] = {"fast": fast}
    nbformat.write(nb, ipynb)


def paired_project(tmp_path: Path, source: str = SOURCE) -> tuple[Path, Path]:
    """``make_project``, its notebook paired and exported (not run): the root and the notebook's stem."""
    root = make_project(tmp_path, source)
    stem = root / "nbs" / "01_toy"
    nbt.sync(stem)
    nbt.export(stem, root)
    return root, stem


@pytest.fixture
def clean_project(tmp_path):
    root, stem = paired_project(tmp_path)
    fake_clean_run(stem.with_suffix(".ipynb"))
    assert nbt.check(root) == []
    return root


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_export_round_trip_writes_header_all_and_working_code(tmp_path):
    root = make_project(tmp_path)
    [target] = nbt.export(root / "nbs" / "01_toy", root)
    assert target == root / "convit_edu" / "toy.py"
    text = target.read_text()
    assert text.startswith('"""Toy chapter."""')
    assert "edit the notebook, not this file" in text and "nbs/01_toy.py" in text
    assert "#|" not in text and "print(" not in text  # directives stripped, unexported cells left out
    module = load_module(target)
    assert module.__all__ == ["circle_area", "SCALE"]  # exporti names stay out of __all__
    assert module.circle_area(2.0) == pytest.approx(4 * 3.141592653589793)
    assert module.helper_not_public(3) == 3
    # exporting again is a no-op, and depends only on the .py text
    assert nbt.export(root / "nbs" / "01_toy", root)[0].read_text() == text


OTHER_MODULE = SOURCE + '''
# %%
#| export shapes
# Shapes other than circles: a second module this chapter exports.

# %%
#| export shapes
from convit_edu.toy import circle_area


def ring_area(outer: float, inner: float) -> float:
    """Area between two circles."""
    return circle_area(outer) - circle_area(inner)
'''


def test_export_name_sends_a_cell_into_another_module_with_its_own_docstring_and_all(tmp_path):
    root = make_project(tmp_path, OTHER_MODULE)
    targets = nbt.export(root / "nbs" / "01_toy", root)
    assert sorted(t.name for t in targets) == ["shapes.py", "toy.py"]
    shapes = (root / "convit_edu" / "shapes.py").read_text()
    assert shapes.startswith('"""Shapes other than circles: a second module this chapter exports."""')
    assert "__all__ = ['ring_area']" in shapes and "from convit_edu.toy import circle_area" in shapes
    assert "ring_area" not in (root / "convit_edu" / "toy.py").read_text()
    stem = root / "nbs" / "01_toy"
    nbt.sync(stem)
    fake_clean_run(stem.with_suffix(".ipynb"))
    assert nbt.check(root) == []  # the second module counts as exported by its notebook
    (root / "convit_edu" / "shapes.py").write_text(shapes + "\n# edited by hand\n")
    assert any("convit_edu/shapes.py differs" in p for p in nbt.check(root))


MORE = SOURCE.replace("#| default_exp toy", "#| default_exp more").replace("# # Toy chapter", "# # More") + '''
# %%
#| export shapes
from convit_edu.shapes import ring_area


def ring_share(outer: float, inner: float) -> float:
    """The ring's share of the outer circle."""
    return ring_area(outer, inner) / circle_area(outer)
'''


def two_chapters(tmp_path: Path, more: str = MORE) -> Path:
    root = make_project(tmp_path, OTHER_MODULE)
    (root / "nbs" / "02_more.py").write_text(more)
    return root


def test_a_module_gathers_its_cells_from_several_chapters_in_chapter_order(tmp_path, monkeypatch):
    root = two_chapters(tmp_path)
    targets = nbt.export(root / "nbs" / "02_more", root)  # one chapter's export writes the module whole
    assert sorted(t.name for t in targets) == ["more.py", "shapes.py"]
    shapes = (root / "convit_edu" / "shapes.py").read_text()
    assert "FROM THE NOTEBOOKS nbs/01_toy.py, nbs/02_more.py:\n# edit the notebooks, not this file" in shapes
    assert shapes.index("def ring_area") < shapes.index("def ring_share")
    assert "__all__ = ['ring_area', 'ring_share']" in shapes
    assert "from convit_edu.shapes import" not in shapes  # the later chapter's import of the module itself
    assert shapes.startswith('"""Shapes other than circles')  # the docstring given in the first chapter
    nbt.export(root / "nbs" / "01_toy", root)
    monkeypatch.setitem(sys.modules, "convit_edu.toy", load_module(root / "convit_edu" / "toy.py"))
    module = load_module(root / "convit_edu" / "shapes.py")
    assert module.ring_share(2.0, 1.0) == pytest.approx(0.75)
    for stem in ("01_toy", "02_more"):
        nbt.sync(root / "nbs" / stem)
        fake_clean_run(root / "nbs" / f"{stem}.ipynb")
    assert nbt.check(root) == []
    (root / "convit_edu" / "shapes.py").write_text(shapes.replace("0.75", "0.5") + "# edited\n")
    assert any("shapes.py differs from a fresh export of nbs/01_toy.py, nbs/02_more.py" in p for p in nbt.check(root))


@pytest.mark.parametrize("cell, says", [
    ("#| export shapes\ndef ring_area(outer, inner):\n    return 0.0\n",
     "'ring_area' is already defined for convit_edu/shapes.py in nbs/01_toy.py, cell"),
    ("#| export shapes\n# Shapes again.\n", "convit_edu/shapes.py has its docstring from nbs/01_toy.py, cell"),
], ids=["a-name-defined-twice", "a-docstring-given-twice"])
def test_a_module_of_several_chapters_refuses_a_name_or_docstring_given_twice(tmp_path, capsys, monkeypatch, cell,
                                                                                says):
    root = two_chapters(tmp_path, MORE + "\n# %%\n" + cell)
    with pytest.raises(nbt.NbToolsError, match=re.escape(says)):
        nbt.project_modules(root)
    assert any(says in p for p in nbt.check(root))
    monkeypatch.chdir(root)
    assert nbt.main(["export"]) == 1 and says in capsys.readouterr().err
    assert not (root / "convit_edu" / "shapes.py").exists()  # refused before anything was written


def test_export_name_refuses_a_bad_module_name(tmp_path):
    root = make_project(tmp_path, SOURCE + "\n# %%\n#| export Bad-Name\nx = 1\n")
    with pytest.raises(nbt.NbToolsError, match="bad module name 'Bad-Name'"):
        nbt.export(root / "nbs" / "01_toy", root)


def test_sync_creates_the_pair_in_both_directions(tmp_path):
    root = make_project(tmp_path)
    stem = root / "nbs" / "01_toy"
    assert "new" in nbt.sync(stem)
    assert nbt.cells_of(nbt.read_py(stem.with_suffix(".py"))) == nbt.cells_of(
        nbt.read_ipynb(stem.with_suffix(".ipynb"))
    )
    assert nbt.sync(stem) is None  # already paired
    stem.with_suffix(".py").unlink()
    assert "<-" in nbt.sync(stem)
    py_text = stem.with_suffix(".py").read_text()
    assert "jupytext_version:" not in py_text and "format_name: percent" in py_text


def test_sync_pairs_with_the_jupytext_settings_of_pyproject(tmp_path):
    root = make_project(tmp_path)
    stem = root / "nbs" / "01_toy"
    nb = nbt.read_py(stem.with_suffix(".py"))
    nb.metadata.pop("jupytext")  # an .ipynb that says nothing of its pairing: pyproject.toml's [tool.jupytext] does
    nbformat.write(nb, stem.with_suffix(".ipynb"))
    stem.with_suffix(".py").unlink()
    assert nbt.sync(stem) == "01_toy.py <- 01_toy.ipynb (new)"
    py = stem.with_suffix(".py")
    assert "format_name: percent" in py.read_text() and "formats:" not in py.read_text()
    assert "jupytext_version:" not in py.read_text()  # its notebook_metadata_filter
    (root / "pyproject.toml").write_text("[project]\nname = 'toy'\n")
    py.write_text(py.read_text().replace("FAST = False", "FAST = True"))
    with pytest.raises(nbt.NbToolsError, match=r"did not pair 01_toy: does pyproject.toml's \[tool.jupytext\]"):
        nbt.sync(stem)


def test_check_passes_on_a_clean_project(clean_project):
    assert nbt.check(clean_project) == []


def test_check_fails_when_a_pair_differs(clean_project):
    py = clean_project / "nbs" / "01_toy.py"
    py.write_text(py.read_text().replace("return x * x", "return x ** 2"))
    (problem,) = nbt.check(clean_project)
    assert "01_toy.py and nbs/01_toy.ipynb differ" in problem
    assert "_nbtools sync" in problem and "_nbtools run" in problem


@pytest.mark.parametrize("missing", [".ipynb", ".py"])
def test_check_fails_when_a_notebook_lacks_its_pair(clean_project, missing):
    (clean_project / "nbs" / f"01_toy{missing}").unlink()
    problems = nbt.check(clean_project)
    assert any("has no paired" in p and "_nbtools sync" in p for p in problems), problems


@pytest.mark.parametrize("counts", [[1, 2, 3, 5, 6], [None, None, None, None, None], [2, 3, 4, 5, 6]])
def test_check_fails_when_a_notebook_was_not_executed_in_one_clean_run(clean_project, counts):
    ipynb = clean_project / "nbs" / "01_toy.ipynb"
    nb = nbformat.read(ipynb, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    assert len(code) == len(counts)
    for cell, n in zip(code, counts):
        cell.execution_count = n
    nbformat.write(nb, ipynb)
    (problem,) = nbt.check(clean_project)
    assert "not executed in one clean run" in problem and "_nbtools run nbs/01_toy.ipynb" in problem


def test_check_fails_when_a_cell_raised(clean_project):
    ipynb = clean_project / "nbs" / "01_toy.ipynb"
    nb = nbformat.read(ipynb, as_version=4)
    nb.cells[-1].outputs = [nbformat.v4.new_output("error", ename="ValueError", evalue="x", traceback=[])]
    nbformat.write(nb, ipynb)
    (problem,) = nbt.check(clean_project)
    assert "ValueError" in problem


def test_check_fails_when_outputs_come_from_a_fast_run(clean_project):
    fake_clean_run(clean_project / "nbs" / "01_toy.ipynb", fast=True)
    (problem,) = nbt.check(clean_project)
    assert "FAST run" in problem and "CONVIT_EDU_FAST=0" in problem


def test_check_fails_when_a_module_differs_from_a_fresh_export(clean_project):
    module = clean_project / "convit_edu" / "toy.py"
    module.write_text(module.read_text().replace("SCALE: float = 2.0", "SCALE: float = 3.0"))
    (problem,) = nbt.check(clean_project)
    assert "convit_edu/toy.py differs from a fresh export" in problem and "_nbtools export" in problem


def test_check_fails_on_a_generated_module_whose_notebook_is_gone(clean_project):
    shutil.copy(clean_project / "convit_edu" / "toy.py", clean_project / "convit_edu" / "old.py")
    (problem,) = nbt.check(clean_project)
    assert "convit_edu/old.py was generated from a notebook that no longer exports it" in problem


def test_syntax_error_in_an_exported_cell_names_the_notebook_and_cell(tmp_path):
    root = make_project(tmp_path, SOURCE.replace("return x * x", "return x *"))
    with pytest.raises(nbt.NbToolsError) as e:
        nbt.export(root / "nbs" / "01_toy", root)
    message = str(e.value)
    assert "nbs/01_toy.py, cell 5" in message and "SyntaxError" in message
    line = next(i for i, s in enumerate(SOURCE.splitlines(), 1) if s.startswith("#| exporti")) - 1
    assert f"(line {line})" in message  # the `# %%` line of that cell in the .py


def test_cli_reports_problems_and_exit_code(clean_project):
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "convit_edu._nbtools", *args],
        cwd=clean_project, capture_output=True, text=True,
    )
    ok = run("check")
    assert ok.returncode == 0 and "0 problem(s) in 1 notebook(s)" in ok.stdout
    (clean_project / "convit_edu" / "toy.py").write_text("")
    bad = run("check")
    assert bad.returncode == 1 and "FAIL convit_edu/toy.py differs" in bad.stdout
    missing = run("run", "nbs/02_nothing.py")
    assert missing.returncode == 1 and "no notebook 'nbs/02_nothing.py'" in missing.stderr


def test_editing_the_py_fails_check_until_synced_exported_and_run(clean_project, monkeypatch):
    """The authoring loop end to end, with a real kernel: each step's message names the next command."""
    root, stem = clean_project, clean_project / "nbs" / "01_toy"
    py = stem.with_suffix(".py")
    py.write_text(py.read_text().replace("SCALE: float = 2.0", "SCALE: float = 4.0"))

    (problem,) = nbt.check(root)
    assert "differ" in problem and "sync" in problem

    nbt.sync(stem)
    problems = nbt.check(root)
    assert any("not executed in one clean run" in p for p in problems)
    assert any("toy.py differs from a fresh export" in p for p in problems)

    nbt.export(stem, root)
    (problem,) = nbt.check(root)
    assert "_nbtools run" in problem

    monkeypatch.delenv("CONVIT_EDU_FAST", raising=False)
    monkeypatch.setenv("CI", "true")  # `run` still executes in full mode unless CONVIT_EDU_FAST says otherwise
    nbt.run(stem, root)
    assert nbt.check(root) == []
    nb = nbformat.read(stem.with_suffix(".ipynb"), as_version=4)
    assert nb.cells[-1].outputs[0]["text"] == "3.1416\n"
    assert "execution" not in nb.cells[-1].metadata  # no timing metadata


IMPORT_CELL = """
# %%
# %matplotlib inline
import math as m
from math import pi, tau as turn
from os.path import (
    join,
    sep,
)
from string import *
from operator import add; total = add(1, 2)


def joined(*parts: str) -> str:
    from os.path import join

    return join(*parts)


print(f"{pi:.4f} {turn:.4f} {joined('a', 'b') == join('a', 'b')} {total} {m.e:.3f} {digits} {sep}")
"""


@pytest.fixture
def import_project(tmp_path):
    """A clean project whose last cell imports in every way; its fake run gave that cell an output."""
    root, stem = paired_project(tmp_path, SOURCE + IMPORT_CELL)
    ipynb = stem.with_suffix(".ipynb")
    fake_clean_run(ipynb)
    nb = nbformat.read(ipynb, as_version=4)
    nb.cells[-1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="3.1416 6.2832 True 3 ...\n")]
    nbformat.write(nb, ipynb)
    assert nbt.check(root) == []
    return root, stem


def sync_edit(stem: Path, old: str, new: str):
    """Edit the last cell of the .py (``old`` -> ``new``), sync, and return that cell of the .ipynb, before and after."""
    py, before = stem.with_suffix(".py"), nbformat.read(stem.with_suffix(".ipynb"), as_version=4).cells[-1]
    assert py.read_text().count(old) == 1
    py.write_text(py.read_text().replace(old, new))
    assert nbt.sync(stem) == "01_toy.py -> 01_toy.ipynb"
    return before, nbformat.read(stem.with_suffix(".ipynb"), as_version=4).cells[-1]


@pytest.mark.parametrize("old, new", [
    ("from math import pi, tau as turn", "from cmath import pi, tau as turn"),  # the module of the names renamed
    ("from os.path import (\n    join,\n    sep,\n)", "from posixpath import join, sep"),  # and the statement rewrapped
    ("from math import pi, tau as turn", "from math import tau as turn\nfrom cmath import pi"),  # a name moved on
    ("    return join(*parts)", "    return join(*parts)  # the parts joined"),  # a comment: nothing runs otherwise
    ("def joined(*parts: str) -> str:", "def joined(\n    *parts: str,\n) -> str:"),  # a line rewrapped
])
def test_a_change_of_the_module_a_name_is_imported_from_or_of_a_comment_keeps_the_outputs(import_project, old, new):
    root, stem = import_project
    before, cell = sync_edit(stem, old, new)
    assert new in cell.source and (cell.outputs, cell.execution_count) == (before.outputs, before.execution_count)
    assert nbt.check(root) == []


@pytest.mark.parametrize("old, new", [
    ("from math import pi, tau as turn", "from math import pi, e as turn"),  # another name
    ("from math import pi, tau as turn", "from math import pi, tau as turn, e"),  # a name added
    ("from math import pi, tau as turn", "from math import tau as turn"),  # a name removed
    ("from math import pi, tau as turn", "from math import pi, tau as full_turn"),  # another alias
    ("import math as m", "import cmath as m"),  # a plain import: its module is the name it imports
    ("from string import *", "from secrets import *"),  # a star import: its module says which names
    ("from operator import add; total", "from _operator import add; total"),  # an import beside code on its line
    ("    from os.path import join", "    from posixpath import join"),  # an import inside a function
    ("{total}", "{total + 0}"),  # code below the imports
    ("    return join(*parts)", "    return join(*reversed(parts))"),  # code inside a function
    ("# %matplotlib inline", "# %matplotlib agg"),  # a magic
])
def test_any_other_change_of_a_code_cell_clears_its_outputs_and_asks_for_a_run(import_project, old, new):
    root, stem = import_project
    if old.startswith("from math"):  # with the module renamed too: it does not hide the other change
        new = new.replace("from math", "from cmath")
    before, cell = sync_edit(stem, old, new)
    assert before.outputs and (cell.outputs, cell.execution_count) == ([], None)
    (problem,) = nbt.check(root)
    assert "01_toy.ipynb was not executed in one clean run" in problem


IMPORTS_SOURCE = HEADER + '''# %% [markdown]
# # Imports chapter

# %%
#| default_exp toy

# %%
#| export
import math
from collections import OrderedDict

import pytest

from convit_edu._nbtools import NbToolsError


def area(r: float) -> float:
    return math.pi * r * r

# %%
#| exporti
from __future__ import annotations

import os.path as osp
import math
from collections import Counter
from convit_edu._nbtools import (
    CELL_TIMEOUT_S, CMD, FAST_VALUES, GENERATED_MARK, PACKAGE, REVEAL, WATCH_HINTS,
    Cell,
)


def _count(words: list[str]) -> Counter:
    return Counter(words)

# %%
#| export
import json
from collections import OrderedDict

# %%
#| export
import textwrap; WIDTH = 12

try:
    import tomllib
except ImportError:
    tomllib = None


def joined(*parts: str) -> str:
    import string

    return osp.join(*parts) + string.digits[:0]

# %%
print(area(1.0))
'''

IMPORTS_BLOCK = """from __future__ import annotations

import json
import math
import os.path as osp
from collections import Counter, OrderedDict

import pytest

from convit_edu._nbtools import (
    CELL_TIMEOUT_S,
    CMD,
    FAST_VALUES,
    GENERATED_MARK,
    PACKAGE,
    REVEAL,
    WATCH_HINTS,
    Cell,
    NbToolsError,
)
"""


@pytest.fixture
def imports_module(tmp_path) -> Path:
    """The module that IMPORTS_SOURCE exports."""
    root = make_project(tmp_path, IMPORTS_SOURCE)
    return nbt.export(root / "nbs" / "01_toy", root)[0]


def test_export_moves_the_imports_of_every_cell_to_one_grouped_block_at_the_top(imports_module):
    text = imports_module.read_text()
    block = text.split("# (then run `python -m convit_edu._nbtools export`).\n\n")[1].split("__all__")[0]
    assert block == IMPORTS_BLOCK + "\n"  # __future__, stdlib, third-party, convit_edu; isort order in each
    cells = text.split("__all__")[1]
    left = [line for line in cells.splitlines() if line.startswith(("import ", "from "))]
    assert left == ["import textwrap; WIDTH = 12"]  # the one that shares its line with other code


def test_export_merges_the_from_imports_of_one_module(imports_module):
    text = imports_module.read_text()
    assert text.count("from collections import") == 1
    assert "from collections import Counter, OrderedDict\n" in text
    assert text.count("from convit_edu._nbtools import (") == 1  # longer than 120 characters: wrapped


def test_export_writes_a_duplicate_import_once(imports_module):
    assert imports_module.read_text().count("import math\n") == 1


def test_export_leaves_imports_below_the_top_level_where_they_are(imports_module):
    text = imports_module.read_text()
    top = text.split("__all__")[0]
    assert "string" not in top and "tomllib" not in top and "textwrap" not in top
    assert "def joined(*parts: str) -> str:\n    import string\n" in text
    assert "try:\n    import tomllib\nexcept ImportError:" in text
    assert "\nimport textwrap; WIDTH = 12\n" in text  # shares its line with other code


def test_export_leaves_no_chunk_for_a_cell_of_imports_only(imports_module):
    text = imports_module.read_text()
    markers = [line for line in text.splitlines() if line.startswith("# %%")]
    assert markers == ["# %% nbs/01_toy.py 3", "# %% nbs/01_toy.py 4", "# %% nbs/01_toy.py 6"]
    assert "# %% nbs/01_toy.py 5" not in text  # the cell of `import json` and a duplicate
    assert not re.search(r"# %%.*\n\s*(\n# %%|$)", text)


def test_a_module_with_merged_imports_executes(imports_module):
    module = load_module(imports_module)
    assert module.__all__ == ["area", "WIDTH", "joined"]
    assert module.area(1.0) == pytest.approx(3.141592653589793)
    assert module._count(["a", "b", "a"]) == {"a": 2, "b": 1}  # names from two cells, imported once
    assert module.joined("a", "b") == "a/b"
    assert module.json.dumps(module.WIDTH) == "12" and module.NbToolsError is nbt.NbToolsError


@pytest.mark.parametrize(
    "cell, clash",
    [
        ("from os.path import join\nfrom shlex import join", "'join' (shlex.join) clashes with 'join'"),
        ("from pathlib import Path\n\n\ndef Path():\n    pass", "'Path' (pathlib.Path) clashes with 'Path'"),
        ("from math import *", "`from math import *` in an exported cell"),
    ],
)
def test_export_refuses_imports_that_would_change_meaning_at_the_top(tmp_path, cell, clash):
    source = SOURCE.replace("# %%\n#| exporti\n", f"# %%\n#| export\n{cell}\n\n# %%\n#| exporti\n")
    root = make_project(tmp_path, source)
    with pytest.raises(nbt.NbToolsError) as e:
        nbt.export(root / "nbs" / "01_toy", root)
    assert "nbs/01_toy.py, cell 5" in str(e.value) and clash in str(e.value)


def test_the_comment_below_default_exp_is_the_module_docstring():
    assert nbe.module_doc("# One line.\n#\n# A second paragraph.") == "One line.\n\nA second paragraph."
    assert nbe.module_doc("") == "" and nbe.module_doc("x = 1  # not a docstring") == ""


EXERCISE = '''
# %%
square = ...  # your answer: def square(x): ...

# %%
from convit_edu.checks import check_answer, demonstrate, grade, reveal


def check_square(fn) -> None:
    check_answer(fn(3) == 9, "multiply x by itself")


grade("square", square, check_square)
demonstrate(check_square, {"x + x": lambda x: x + x})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(square):  # a reference answer
    def square(x):
        return x * x

    grade("square", square, check_square)
'''


@pytest.fixture
def exercise_project(tmp_path):
    return paired_project(tmp_path, SOURCE + EXERCISE)


def test_run_leaves_the_exercises_to_the_student_and_answers_them_only_when_asked(exercise_project, monkeypatch):
    """X3 of course review 2: the run command the index offers used to answer every exercise."""
    root, stem = exercise_project
    monkeypatch.setenv("CONVIT_EDU_SOLUTIONS", "1")  # a leftover in the environment does not answer them: only --answers
    monkeypatch.setenv("CI", "true")
    nbt.run(stem, root)
    nb = nbformat.read(stem.with_suffix(".ipynb"), as_version=4)
    (ex,) = nbt.exercises(nb)
    assert nb.cells[ex.check].outputs[0]["text"].startswith("square: not answered yet\n")
    assert nb.cells[ex.reference].outputs == [] and nb.metadata["convit_edu"]["solutions"] is False
    assert nbt.check(root) == []

    nbt.run(stem, root, answers=True)
    nb = nbformat.read(stem.with_suffix(".ipynb"), as_version=4)
    assert nb.cells[ex.reference].outputs[0]["text"] == "square: correct\n"
    (problem,) = nbt.check(root)
    assert "01_toy.ipynb shows the answers of 'square'" in problem and "_nbtools run nbs/01_toy.ipynb" in problem


def test_check_finds_an_answer_left_in_a_committed_notebook(exercise_project):
    root, stem = exercise_project
    ipynb = stem.with_suffix(".ipynb")
    nb = nbformat.read(ipynb, as_version=4)
    (ex,) = nbt.exercises(nb)
    nb.cells[ex.check].outputs = [nbformat.v4.new_output("stream", name="stdout", text="square: not answered yet\n")]
    nbformat.write(nb, ipynb)
    fake_clean_run(ipynb)
    assert nbt.check(root) == []
    nb = nbformat.read(ipynb, as_version=4)
    nb.cells[ex.check].outputs[0]["text"] = "square: correct\n"  # an answer typed in, then committed
    nbformat.write(nb, ipynb)
    (problem,) = nbt.check(root)
    assert "shows the answers of 'square'" in problem


def test_an_exercise_is_read_as_its_three_cells_and_the_answer_a_student_would_type(exercise_project):
    _, stem = exercise_project
    nb = nbformat.read(stem.with_suffix(".ipynb"), as_version=4)
    (ex,) = nbt.exercises(nb)
    assert (ex.check, ex.reference) == (ex.answer + 1, ex.answer + 2) and ex.names == ("square",)
    assert ex.answer_code == "def square(x):\n    return x * x"
    assert set(nbt.hint_sites(nb.cells[ex.check].source)) == {("check_square", 1)}


def test_answers_is_an_option_of_run_only(clean_project):
    result = subprocess.run([sys.executable, "-m", "convit_edu._nbtools", "check", "--answers"], cwd=clean_project,
                            capture_output=True, text=True)
    assert result.returncode == 2 and "--answers is an option of run" in result.stderr
