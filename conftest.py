"""Make a bare `pytest` also validate every notebook in nbs/ with nbval, when nbval is installed.

Equivalent to `pytest --nbval --nbval-current-env --nbval-sanitize-with nbs/nbval_sanitize.cfg`, but for one thing:
a chapter with exercises runs as a student who typed each reference answer into its answer cell
(`convit_edu._nbtools.answered_notebook`), with the reference answers off (`CONVIT_EDU_SOLUTIONS` unset). Every cell's
output must equal the committed one, a student's run, except that each check now says `correct` where the committed
notebook says `not answered yet`; and the check on every demonstrated slip must have given every hint its checks can
give. One run of each chapter proves both that the committed outputs hold and that every reference answer is right
where a student's answer is graded. `pytest -p no:nbval` turns the notebooks off; `--nbval-lax` runs nbval's own
collection (outputs not compared), without the answers.
"""

from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest

COLLECTS_NOTEBOOKS = pytest.StashKey[bool]()


def pytest_configure(config):
    if not config.pluginmanager.hasplugin("nbval"):
        return
    opt = config.option
    opt.nbval_current_env = True
    if not opt.nbval_sanitize_with:
        opt.nbval_sanitize_with = str(Path(__file__).parent / "nbs" / "nbval_sanitize.cfg")
    if not opt.nbval_lax:
        opt.nbval = False  # nbval's own collector stands aside: pytest_collect_file below collects the notebooks
        config.stash[COLLECTS_NOTEBOOKS] = True


def pytest_collect_file(file_path, parent):
    if file_path.suffix == ".ipynb" and parent.config.stash.get(COLLECTS_NOTEBOOKS, False):
        return _collector().from_parent(parent, path=file_path)
    return None


@cache
def _collector():
    """nbval's notebook collector, reading a chapter with exercises as `answered_notebook` writes it."""
    import nbformat
    from nbval.plugin import IPyNbCell, IPyNbFile, find_comment_markers, find_metadata_tags

    from convit_edu._nbtools import answered_notebook, exercises

    class AnsweredNotebook(IPyNbFile):
        def collect(self):
            nb = nbformat.read(str(self.path), as_version=4)
            where = str(self.path.relative_to(self.config.rootpath))
            self.nb = answered_notebook(nb, where) if exercises(nb, where) else nb
            code = [cell for cell in self.nb.cells if cell.cell_type == "code"]
            for number, cell in enumerate(code):
                options = defaultdict(bool, find_metadata_tags(cell.metadata))
                options.update(find_comment_markers(cell.source))
                options.setdefault("check", self.compare_outputs)
                yield IPyNbCell.from_parent(self, name=f"Cell {number}", cell_num=number, cell=cell, options=options)

    return AnsweredNotebook
