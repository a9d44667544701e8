"""Project-wide guarantees: packaging stays consistent, imports stay light, notebooks and modules agree."""

import ast
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import convit_edu
from convit_edu import _nbexport, _nbtools

ROOT = Path(__file__).resolve().parents[1]

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_environment_yml_installs_this_package_with_its_dev_extra_and_nothing_else():
    """environment.yml cannot drift from pyproject.toml: every package comes from pyproject's lists."""
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    project = pyproject()["project"]
    conda, pip_entries = [], []
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            pip_entries += dep["pip"]
        else:
            conda.append(dep)
    python = [d for d in conda if d.startswith("python")]
    assert python == ["python=3.11"] and sorted(conda) == ["pip", "python=3.11"], conda
    minimum = re.fullmatch(r">=\s*([\d.]+)", project["requires-python"]).group(1)
    assert version_tuple("3.11") >= version_tuple(minimum)
    (entry,) = pip_entries
    match = re.fullmatch(r"-e \.\[(\w+)\]", entry)
    assert match, f"environment.yml should install the package itself with `-e .[dev]`, not {entry!r}"
    assert match.group(1) in project["optional-dependencies"]


def test_pyproject_uses_ranges_and_ci_pins_torch():
    project = pyproject()["project"]
    names = {re.split(r"[<>=!~\[ ]", d)[0]: d for d in project["dependencies"]}
    assert set(names) == {"torch", "torchvision", "einops", "matplotlib", "fastprogress", "numpy", "Pillow"}
    dev = {re.split(r"[<>=!~\[ ]", d)[0] for d in project["optional-dependencies"]["dev"]}
    assert dev == {"pytest", "pytest-xdist", "jupytext", "nbval", "nbclient", "ipykernel", "timm"}
    course = {re.split(r"[<>=!~\[ ]", d)[0] for d in project["optional-dependencies"]["course"]}
    assert course == {"jupyterlab"}  # the README's student path: `pip install -e ".[course]"`, then `jupyter lab`
    extras = project["optional-dependencies"]
    for spec in project["dependencies"] + extras["dev"] + extras["course"]:
        assert "==" not in spec, f"users need ranges, not pins: {spec}"
    pins = (ROOT / ".ci" / "constraints.txt").read_text()
    assert "torch==2.14.1" in pins and "torchvision==0.29.1" in pins


def test_importing_the_package_loads_no_notebook_tooling():
    modules = [
        f"convit_edu.{m.name}" for m in pkgutil.iter_modules(convit_edu.__path__) if m.name != "_nbtools"
    ]
    code = (
        "import importlib, sys\n"
        f"for name in ['convit_edu'] + {modules!r}: importlib.import_module(name)\n"
        "heavy = {'jupytext', 'nbval', 'nbclient', 'nbformat'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_notebooks_and_modules_pass_the_nbtools_check():
    """What `python -m convit_edu._nbtools check` reports: pairs equal, clean full runs, fresh exports."""
    problems = _nbtools.check(ROOT)
    assert problems == [], "\n".join(problems)


def test_readme_quick_start_has_the_main_job_the_test_command_and_the_portability_pass():
    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quick start")[1].split("\n## ")[0]
    blocks = re.findall(r"```bash\n(.*?)```", quick, flags=re.S)
    assert len(blocks) == 3 and all(len(b.strip().splitlines()) == 1 for b in blocks), blocks
    assert "pytest" in blocks[1]
    marker = "<!-- .ci/run executes the command in the next code block: keep it one line -->"
    assert quick.split(marker)[1].lstrip().startswith(f"```bash\n{blocks[1]}```")
    marker = "<!-- .ci/run then executes the command in the next code block (the portability pass): keep it one line -->"
    assert quick.split(marker)[1].lstrip().startswith(f"```bash\n{blocks[2]}```")
    assert blocks[2].split() == [*PORTABILITY_ENV, "pytest", *PARALLEL, "nbs/"]
    assert blocks[1].split()[-5:] == ["pytest", *PARALLEL]


PARALLEL = ["-n", "auto", "--dist", "loadfile"]  # one file per core at a time: a notebook's cells share a kernel
PORTABILITY_ENV = ["ATEN_CPU_CAPABILITY=default", "MKL_ENABLE_INSTRUCTIONS=SSE4_2", "DNNL_MAX_CPU_ISA=SSE41",
                   "OMP_NUM_THREADS=1"]


def test_the_portability_pass_really_changes_torchs_kernels_and_threads():
    """The guard is worth something only if torch obeys it: its dispatch falls back to the plain kernels."""
    env = dict(item.split("=") for item in PORTABILITY_ENV)
    code = "import torch; print(torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())"
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["DEFAULT", "1"], out


def package_imports() -> dict[str, set[str]]:
    """Each module of the package and the package modules it imports, anywhere in its code."""
    graph = {}
    for module in pkgutil.iter_modules(convit_edu.__path__):
        text = (ROOT / "convit_edu" / f"{module.name}.py").read_text()
        graph[module.name] = set(re.findall(r"^\s*from convit_edu\.(\w+) import", text, re.M)) - {module.name}
    return graph


def test_the_package_import_graph_is_one_way():
    graph, done, path = package_imports(), set(), []

    def visit(name: str) -> None:
        assert name not in path, f"circular imports: {' -> '.join([*path[path.index(name):], name])}"
        if name in done:
            return
        path.append(name)
        for imported in sorted(graph[name]):
            visit(imported)
        path.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)
    assert graph["training"] >= {"config", "distributed", "optimisation", "run_state"}  # the graph was read at all


def import_depth(graph: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each module's longest chain of package imports, itself first."""
    chains: dict[str, list[str]] = {}

    def chain(name: str) -> list[str]:
        if name not in chains:
            chains[name] = [name] + max((chain(m) for m in sorted(graph[name])), key=len, default=[])
        return chains[name]

    for name in graph:
        chain(name)
    return chains


def test_the_import_graph_is_at_most_15_deep_and_the_data_wing_stands_beside_the_models():
    """15: the GPU check (gpu_check <- gpu_check_time) stands on the benchmark suite it measures with (its compile
    time and the machine's peak), one floor above the command line's 14."""
    graph = package_imports()
    chains = import_depth(graph)
    longest = max(chains.values(), key=len)
    assert len(longest) <= 15, " <- ".join(longest)
    assert graph["files"] == set()  # the ground floor imports nothing of the package
    below_data = set(chains["datasets"]) | set(chains["image_files"]) | set(chains["photographs"])
    assert not below_data & {"models", "gpsa", "pretrained", "zoo"}, below_data


def test_a_deeper_import_graph_would_be_caught(monkeypatch):
    deep = {f"m{i}": {f"m{i + 1}"} for i in range(15)} | {"m15": set(), "files": set(), "datasets": set(),
                                                          "image_files": set(), "photographs": set()}
    monkeypatch.setattr(sys.modules[__name__], "package_imports", lambda: deep)
    with pytest.raises(AssertionError, match="m0 <- m1"):
        test_the_import_graph_is_at_most_15_deep_and_the_data_wing_stands_beside_the_models()


def test_a_cycle_in_the_import_graph_would_be_caught(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "package_imports", lambda: {"a": {"b"}, "b": {"a"}})
    with pytest.raises(AssertionError, match="circular imports: a -> b -> a"):
        test_the_package_import_graph_is_one_way()


def chapter_imports() -> list[tuple[str, int, str, int]]:
    """(chapter, its number, what it imports of the package — a module, or `module.name` —, the number of the
    chapter that exports it). A module may gather cells from several chapters, so a name counts from the chapter
    that defines it, a module from its first chapter; read from each chapter's exported cells
    (`_nbexport.notebook_parts`) and its imports (`from convit_edu.X import a, b` on one line or in parentheses,
    `import convit_edu.X`, `from convit_edu import X`)."""
    chapters = sorted((ROOT / "nbs").glob("[0-9][0-9]_*.py"))
    owner: dict[str, int] = {}  # module, and module.name, -> the chapter that exports it first
    for p in chapters:
        for module, part in _nbexport.notebook_parts(p, ROOT).items():
            for key in [module, *(f"{module}.{name}" for name in part.defined)]:
                owner.setdefault(key, int(p.name[:2]))
    found = []
    for p in chapters:
        text = p.read_text()
        used = set(re.findall(r"^\s*import convit_edu\.(\w+)", text, re.M))
        used |= {name.split(" as ")[0].strip() for names in re.findall(r"^\s*from convit_edu import ([\w ,]+)", text, re.M)
                 for name in names.split(",")}
        for module, names in re.findall(r"^\s*from convit_edu\.(\w+) import (\([^)]*\)|[^(\n]+)$", text, re.M):
            for name in names.strip("()").replace("\n", " ").split(","):
                key = f"{module}.{name.split(' as ')[0].strip()}"
                used.add(key if key in owner else module)
        found += [(p.stem, int(p.name[:2]), key, owner[key]) for key in sorted(used) if key in owner]
    return found


def test_chapters_are_in_dependency_order():
    """No chapter imports a module that a later chapter exports: a reader going front to back never meets a tool
    before the chapter that builds it (the course's photographs, which chapters 08 and 11 need, come from chapter
    00_photographs, the set-up before chapter 01)."""
    found = chapter_imports()
    later = [f"{stem} imports {module} (chapter {n:02d})" for stem, number, module, n in found if number < n]
    assert not later, "chapters out of dependency order: " + "; ".join(later)
    assert ("27_run_setup", 27, "optimisation.build_optimizer", 23) in found  # the imports were read at all


def test_a_chapter_that_imports_a_later_module_would_be_caught(monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "chapter_imports", lambda: [
        ("00_photographs", 0, "image_files.load_rgb", 13), ("28_training", 28, "optimisation.build_optimizer", 23),
        ("18_dali", 18, "benchmarks.bench_model", 30)])
    with pytest.raises(AssertionError, match=r"00_photographs imports image_files.load_rgb \(chapter 13\); "
                                             r"18_dali imports benchmarks.bench_model \(chapter 30\)"):
        test_chapters_are_in_dependency_order()


def cross_module_imports() -> list[tuple[str, str, str]]:
    """(importing module, imported module, name) for each name of each `from convit_edu.X import ...` in the
    package's code, read from each module's syntax tree."""
    found = []
    for module in pkgutil.iter_modules(convit_edu.__path__):
        tree = ast.parse((ROOT / "convit_edu" / f"{module.name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("convit_edu."):
                source = node.module.split(".", 1)[1]
                found += [(module.name, source, alias.name) for alias in node.names if source != module.name]
    return found


def public_names(module: str) -> set[str]:
    """The names in a package module's `__all__`, read from its source."""
    tree = ast.parse((ROOT / "convit_edu" / f"{module}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "__all__" for target in node.targets):
            return set(ast.literal_eval(node.value))
    return set()


def test_no_private_name_crosses_a_module_and_every_imported_name_is_public():
    imports = cross_module_imports()
    private = [f"{a} imports {b}.{name}" for a, b, name in imports if name.startswith("_")]
    assert not private, f"private names cross a module: {', '.join(private)}"
    unlisted = [f"{a} imports {b}.{name}" for a, b, name in imports if name not in public_names(b)]
    assert not unlisted, f"imported but not in the module's __all__: {', '.join(unlisted)}"
    assert ("training", "distributed", "World") in imports  # the imports were read at all


@pytest.mark.parametrize("planted, match", [
    (("training", "distributed", "_World"), "private names cross a module: training imports distributed._World"),
    (("training", "distributed", "sys"), "not in the module's __all__: training imports distributed.sys"),
])
def test_a_private_or_unlisted_import_would_be_caught(monkeypatch, planted, match):
    monkeypatch.setattr(sys.modules[__name__], "cross_module_imports", lambda: [planted])
    with pytest.raises(AssertionError, match=re.escape(match)):
        test_no_private_name_crosses_a_module_and_every_imported_name_is_public()


def core_chapters() -> list[str]:
    """The core path, as the index's map lists it (nbs/00_index.py, `CORE`)."""
    text = (ROOT / "nbs" / "00_index.py").read_text()
    return re.findall(r'^\s+\("(\d\d_\w+)",', text[text.index("CORE = [") : text.index("ENGINEERING = [")], re.M)


def figure_problems(nb) -> list[str]:
    """Where a notebook makes a figure but does not show it: a figure output without its PNG (a bare
    `<Figure size ...>`), or a cell that calls `plt.show()` and holds no PNG. Cells tagged `solution` (reference
    answers, which a student's run does not execute) are left out."""
    problems = []
    for number, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        if "solution" in cell.metadata.get("tags", ()):
            continue
        pngs = [o for o in cell.outputs if "image/png" in o.get("data", {})]
        bare = [o for o in cell.outputs if "image/png" not in o.get("data", {})
                and "<Figure size" in o.get("text", "") + o.get("data", {}).get("text/plain", "")]
        if bare:
            problems.append(f"code cell {number}: {len(bare)} figure(s) as text, no PNG")
        elif "plt.show()" in cell.source and not pngs:
            problems.append(f"code cell {number}: plt.show() and no PNG")
    return problems


@pytest.mark.parametrize("stem", core_chapters())
def test_every_core_chapter_shows_its_figures_as_pictures(stem):
    """A committed core chapter holds a PNG for every figure its cells make (course review 2, N15: chapter 33's five
    figures were committed as `<Figure size 640x256 with 2 Axes>` text)."""
    import nbformat

    assert figure_problems(nbformat.read(ROOT / "nbs" / f"{stem}.ipynb", as_version=4)) == []


def test_a_figure_committed_as_text_would_be_caught():
    import nbformat

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("fig"), nbformat.v4.new_code_cell("plt.show()")])
    nb.cells[0].outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "<Figure size 640x256 with 2 Axes>"})]
    assert figure_problems(nb) == ["code cell 0: 1 figure(s) as text, no PNG", "code cell 1: plt.show() and no PNG"]
    nb.cells[1].outputs = [nbformat.v4.new_output("display_data", data={"image/png": "iVBOR", "text/plain": "<Figure>"})]
    assert figure_problems(nb) == ["code cell 0: 1 figure(s) as text, no PNG"]


def test_the_sbatch_script_is_a_file_the_package_ships():
    from convit_edu.distributed import SBATCH_SCRIPT

    assert SBATCH_SCRIPT.read_text().startswith("#!/bin/bash\n#SBATCH")
    shipped = pyproject()["tool"]["setuptools"]["package-data"]["convit_edu"]
    assert any(Path(SBATCH_SCRIPT.name).match(pattern.split("/")[-1]) for pattern in shipped)
    assert f"convit_edu/slurm/{SBATCH_SCRIPT.name}" in (ROOT / "README.md").read_text()
