"""The GPU check (`convit-edu-check-gpu`, chapters 44 and 45): its smoke run on the CPU, a failing phase, the deadline,
bad input, a compiled throughput. One smoke run of every phase (about a minute on 2 cores) serves the tests that read
its results."""

import contextlib
import io
import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from convit_edu import gpu_check
from convit_edu.gpu_check import PHASES, is_sync_warning, main
from convit_edu.gpu_correctness import CheckContext, CheckSizes, PhaseResult, collect_environment

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")


def check(argv: list[str]) -> tuple[int, str, str]:
    """`convit-edu-check-gpu ARGV` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """`--smoke` with every phase: (exit status, results.json, what it printed, its folder)."""
    output = tmp_path_factory.mktemp("gpu-check") / "smoke"
    with pytest.MonkeyPatch.context() as mp:  # the file-list cache of its JPEG folder: not the user's
        mp.setenv("XDG_CACHE_HOME", str(output.parent / "xdg-cache"))
        status, printed, _ = check(["--smoke", "--output", str(output)])
    return status, json.loads((output / "results.json").read_text()), printed, output


def phase(results: dict, name: str) -> dict:
    return next(p for p in results["phases"] if p["name"] == name)


def test_the_smoke_check_runs_every_phase_in_order_and_none_fails(smoke):
    status, results, printed, output = smoke
    assert status == 0 and results["finished"] and results["exit_status"] == 0 and results["mode"] == "smoke"
    assert [p["name"] for p in results["phases"]] == list(PHASES)
    for p in results["phases"]:
        assert p["status"] in ("PASS", "INFO", "SKIP") and p["summary"] and p["seconds"] >= 0, p
    env = results["environment"]
    for key in ("gpu", "driver", "cuda", "torch", "torchvision", "python", "cpu_model", "cpu_count", "date_utc",
                "fastprogress", "dali", "shm_gib"):
        assert key in env, key
    assert env["gpu"] is None and env["cpu_count"] >= 1 and isinstance(env["dali"], bool)
    summary = (output / "summary.txt").read_text().splitlines()
    assert len(summary) == len(PHASES) + 2 and summary[-1].endswith("exit status 0")
    assert printed.rstrip().endswith(f"results: {output / 'results.json'}") and summary[1] in printed


def test_the_smoke_phases_measure_what_they_claim(smoke):
    _, results, _, _ = smoke
    steps = {(r["model"], r["precision"]): r for r in phase(results, "step_vs_cpu")["details"]["rows"]}
    assert steps["deit_tiny", "fp32"]["loss_rel"] == 0  # the CPU against itself
    assert 0 < steps["deit_tiny", "bf16"]["loss_rel"] < 2e-2 and 0.99 < steps["deit_tiny", "bf16"]["grad_cos"] < 1
    gpsa = phase(results, "gpsa")["details"]["rows"]
    assert all(r["out_rel"] < 1e-5 for r in gpsa if r["precision"] == "fp32")
    assert all(1e-4 < r["out_rel"] < 2e-2 for r in gpsa if r["precision"] == "bf16")  # bf16 was really used
    assert phase(results, "graph_breaks")["details"]["convit_tiny"] == {"graphs": 1, "breaks": 0, "reasons": []}
    assert phase(results, "host_syncs")["status"] == "SKIP" and "GPU" in phase(results, "host_syncs")["summary"]
    run = phase(results, "compiled_train")["details"]
    assert [row["epoch"] for row in run["history"]] == [1, 2] and run["syncs"] is None
    jpeg = phase(results, "jpeg_torchvision")["details"]
    assert jpeg["jpegs"] == 4 * (8 + 2)
    for name in ("jpeg_torchvision", "jpeg_gpu_decode"):  # gpu-decode decodes on the CPU here: the same JPEGs
        jpeg = phase(results, name)["details"]
        assert phase(results, name)["status"] == "PASS" and [row["epoch"] for row in jpeg["log"]] == [1, 2]
        assert jpeg["eval"]["top1"] == pytest.approx(jpeg["log"][-1]["val_top1"])
    rows = phase(results, "throughput_ti")["details"]["rows"]
    assert [(r["model"], r["batch"]) for r in rows] == [("convit_tiny", 8), ("deit_tiny", 8), ("convit_tiny", 4),
                                                        ("convit_tiny", 16)]
    assert all(r["train_images_per_s"] > 0 for r in rows)


def test_a_compiled_throughput_row_measures_the_compile_with_the_packages_own_steps(monkeypatch, tmp_path):
    """On a GPU the models also run compiled; here Dynamo's eager backend stands in for Inductor (~50 s a model): the
    compile is measured by `compile_seconds`, and `measure_model`'s compiled steps find its code in the cache."""
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: compile_(model, backend="eager", **kwargs))
    ctx = CheckContext(replace(CheckSizes.smoke(), compile=True), tmp_path, {}, budget_s=480)
    torch._dynamo.reset()
    counters.clear()
    try:
        row = gpu_check._rates(ctx, "deit_tiny", 2, compiled=True)
        frames = counters["frames"]["total"]
    finally:
        torch._dynamo.reset()
    assert row["mode"] == "compiled" and row["compile_s"] > 0 and row["train_images_per_s"] > 0
    assert frames == 2  # the training and the inference forward, each compiled once


def test_a_phase_that_raises_fails_alone_and_the_results_are_written_after_every_phase(monkeypatch, tmp_path):
    written = []

    def boom(ctx):
        raise RuntimeError("the GPU caught fire\nand a second line")

    def after(ctx):
        written.append(json.loads((tmp_path / "out" / "results.json").read_text()))
        return PhaseResult("PASS", "still checked")

    monkeypatch.setattr(gpu_check, "PHASES", {"env": PHASES["env"], "boom": boom, "after": after})
    status, printed, _ = check(["--smoke", "--output", str(tmp_path / "out")])
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert status == 1 and results["finished"] and results["exit_status"] == 1
    assert [(p["name"], p["status"]) for p in results["phases"]] == [("env", "INFO"), ("boom", "FAIL"),
                                                                      ("after", "PASS")]
    assert results["phases"][1]["summary"] == "RuntimeError: the GPU caught fire"
    assert "Traceback" in results["phases"][1]["details"]["traceback"]
    assert [p["name"] for p in written[0]["phases"]] == ["env", "boom"] and not written[0]["finished"]
    assert "FAIL  boom" in printed and "exit status 1" in printed


def test_the_deadline_skips_the_phases_that_would_begin_after_the_budget(monkeypatch, tmp_path):
    def slow(ctx):
        time.sleep(1.6)
        return PhaseResult("INFO", "slow")

    monkeypatch.setattr(gpu_check, "PHASES", {"env": PHASES["env"], "first": slow, "second": slow, "third": slow})
    status, _, _ = check(["--smoke", "--budget-s", "1.5", "--output", str(tmp_path)])
    phases = json.loads((tmp_path / "results.json").read_text())["phases"]
    assert status == 0 and [p["status"] for p in phases] == ["INFO", "INFO", "SKIP", "SKIP"]
    assert phases[2]["summary"] == "deadline: the 1.5 s budget was spent before it began"


def test_phases_runs_some_phases_again_after_env(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_check, "PHASES", {"env": PHASES["env"], "a": lambda ctx: PhaseResult("INFO", "a"),
                                              "b": lambda ctx: PhaseResult("INFO", "b")})
    assert check(["--smoke", "--phases", "b", "--output", str(tmp_path)])[0] == 0
    assert [p["name"] for p in json.loads((tmp_path / "results.json").read_text())["phases"]] == ["env", "b"]


@pytest.mark.parametrize("argv, named", [
    (["--budget-s", "-5"], "got -5.0"),
    (["--budget-s", "inf"], "got inf"),
    (["--budget-s", "soon"], "'soon'"),
    (["--phases", "warp"], "'warp'"),
    (["--output", "{tmp}/a-file/results"], "{tmp}/a-file/results"),
])
def test_bad_input_is_one_line_naming_the_value_before_any_work(tmp_path, argv, named):
    (tmp_path / "a-file").write_text("not a folder")
    argv = [a.format(tmp=tmp_path) for a in argv]
    status, printed, err = check(["--smoke", *argv] + ([] if "--output" in argv else ["--output", str(tmp_path / "o")]))
    assert status == 2 and printed == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("convit-edu-check-gpu: error: ") and named.format(tmp=tmp_path) in err
    assert not (tmp_path / "o" / "results.json").exists()


def test_only_a_synchronising_call_counts_as_a_sync_not_the_modes_notice():
    """torch's two messages, as its CUDA build words them (libtorch_python, libc10_cuda): the notice printed once when
    sync-debug mode is switched on mentions "synchronizing operations" and is no sync (the H200 check's false FAIL)."""
    notice = UserWarning("Synchronization debug mode is a prototype feature and does not yet detect all "
                         "synchronizing operations")
    assert not is_sync_warning(notice)
    assert is_sync_warning(UserWarning("called a synchronizing CUDA operation (Triggered internally at ...)"))


def test_the_check_is_a_console_script_of_the_package():
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["convit-edu-check-gpu"] == "convit_edu.gpu_check:main"


def test_without_a_gpu_the_full_check_fails_env_and_skips_every_other_phase(monkeypatch, tmp_path):
    """On a machine whose torch sees no GPU, `convit-edu-check-gpu` (not --smoke) says so once and runs nothing else."""
    ran = []
    monkeypatch.setattr(gpu_check, "collect_environment", lambda: {**collect_environment(), "gpu": None})
    monkeypatch.setattr(gpu_check, "PHASES", {"env": PHASES["env"], "gpsa": lambda ctx: ran.append(ctx) or None})
    status, printed, _ = check(["--output", str(tmp_path / "out")])
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert status == 1 and ran == [] and [(p["name"], p["status"]) for p in results["phases"]] == [
        ("env", "FAIL"), ("gpsa", "SKIP")]
    assert "sees no GPU" in results["phases"][0]["summary"] and "--smoke" in results["phases"][1]["summary"]
