"""The GPU check (`convit-edu check-gpu`, chapters 44 and 45): its smoke run on the CPU, a failing phase, the deadline
and the predicted seconds, bad input, a compiled model row, the command line. One smoke run of every phase (a minute
or two on 2 cores) serves the tests that read its results."""

import contextlib
import io
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch._dynamo.utils import counters

from convit_edu import gpu_check
from convit_edu import cli
from convit_edu.cli import build_parser
from convit_edu.gpu_check import PHASES, TARGETS, main
from convit_edu.gpu_check_correctness import CheckContext, CheckSizes, Phase, PhaseResult, collect_environment
from convit_edu.gpu_check_time import bf16_peak, model_bench

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
        assert p["predicted_s"] == PHASES[p["name"]].smoke_s
    env = results["environment"]
    for key in ("gpu", "driver", "cuda", "torch", "torchvision", "python", "cpu_model", "cpu_count", "date_utc",
                "fastprogress", "dali", "shm_gib"):
        assert key in env, key
    assert env["gpu"] is None and env["cpu_count"] >= 1 and isinstance(env["dali"], bool)
    summary = (output / "summary.txt").read_text().splitlines()
    assert len(summary) == 1 + len(PHASES) + 1 + len(TARGETS) + 1 and summary[-1].endswith("exit status 0")
    assert summary[1 + len(PHASES)] == "targets (DESIGN §9):" and summary[1] in printed
    assert printed.startswith("plan (smoke): env 1 s") and printed.rstrip().endswith(
        f"results: {output / 'results.json'}")


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
    graphs = phase(results, "graphs_vs_eager")["details"]
    assert graphs["cuda_graphs"] == "auto" and len(graphs["losses"]) == 4 and graphs["weights_rel"] == 0


def test_the_model_phases_time_profile_and_count_each_step(smoke):
    _, results, _, _ = smoke
    for name, models in (("models_s", ["convit_small", "deit_small"]), ("models_ti", ["convit_tiny", "deit_tiny"])):
        details = phase(results, name)["details"]
        assert [r["model"] for r in details["rows"]] == models and set(details["ratios"]) == {"eager", "graphed"}
        for row in details["rows"]:
            assert "compiled" not in row and "error" not in row  # no compile in the smoke
            flops, ops = row["flops_per_image"], row["cpu_operations"]
            assert flops["total"] == flops["counted"] + flops["attention"] and flops["attention"] > 0
            assert ops["forward"] > 0 and ops["backward"] > 0 and ops["optimizer"] > 0
            for variant in ("eager", "graphed"):
                m = row[variant]
                assert m["kernels"] == 0 and m["busy_share"] is None and m["host_ops"] > 0  # a CPU's trace
                assert m["images_per_s"] == pytest.approx(row["batch"] / m["pipelined_s"])
                assert m["mfu"] == pytest.approx(flops["total"] * m["images_per_s"] / row["peak"]["flops"])
        convit, deit = (r["cpu_operations"]["forward"] + r["cpu_operations"]["backward"] for r in details["rows"])
        assert convit > deit  # the GPSA layers' extra operations


def test_the_train_phases_split_each_epochs_data_wait_and_resume(smoke):
    _, results, _, _ = smoke
    for name, epochs in (("decode_convit_s", [1, 2]), ("decode_deit_s", [1]), ("pil_convit_s", [1, 2]),
                         ("pil_deit_s", [1, 2])):
        p = phase(results, name)
        details = p["details"]
        assert p["status"] == "PASS" and [e["epoch"] for e in details["epochs"]] == epochs, p["summary"]
        assert [row["epoch"] for row in details["log"]] == epochs and details["cuda_graphs"] == "auto"
        assert details["recompiles"] == details["graph_breaks"] == 0
        for e in details["epochs"]:  # 4 steps an epoch, a line each: the first the start-up, 3 steady
            assert e["startup"]["steps"] == 1 and e["steady"]["steps"] == 3
        assert details["steady"] == details["epochs"][-1]["steady"]
    decode = phase(results, "decode_convit_s")["details"]
    assert decode["jpegs"] == 4 * (8 + 2) and decode["eval"]["top1"] == pytest.approx(decode["log"][-1]["val_top1"])


def test_the_targets_are_reported_but_not_judged_at_the_smoke_sizes(smoke):
    _, results, _, output = smoke
    targets = results["targets"]
    assert [t["status"] for t in targets] == ["INFO"] * len(TARGETS)
    assert all(t["target"].startswith(spec.name) for t, spec in zip(targets, TARGETS))
    assert f"INFO  {targets[0]['target']}: {targets[0]['measured']}" in (output / "summary.txt").read_text()


def test_a_compiled_model_row_measures_the_compile_with_the_packages_own_steps(monkeypatch, tmp_path):
    """On a GPU the models also run compiled; here Dynamo's eager backend stands in for Inductor (~50 s a model): the
    compile is measured by `compile_seconds`, and the compiled and graphed steps find its code in the cache."""
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: compile_(model, backend="eager", **kwargs))
    sizes = replace(CheckSizes.smoke(), compile=True, batch=2)
    ctx = CheckContext(sizes, tmp_path, collect_environment(), budget_s=480)
    torch._dynamo.reset()
    counters.clear()
    try:
        row = model_bench(ctx, "deit_tiny", bf16_peak(ctx))
        frames = counters["frames"]["total"]
    finally:
        torch._dynamo.reset()
    assert "error" not in row and row["compile_s"] > 0
    assert all(row[v]["images_per_s"] > 0 for v in ("eager", "compiled", "graphed"))
    assert frames == 1  # the training forward, compiled once


def test_a_phase_that_raises_fails_alone_and_the_results_are_written_after_every_phase(monkeypatch, tmp_path):
    written = []

    def boom(ctx):
        raise RuntimeError("the GPU caught fire\nand a second line")

    def after(ctx):
        written.append(json.loads((tmp_path / "out" / "results.json").read_text()))
        return PhaseResult("PASS", "still checked")

    monkeypatch.setattr(gpu_check, "PHASES", {"env": PHASES["env"], "boom": Phase(boom), "after": Phase(after)})
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

    monkeypatch.setattr(gpu_check, "PHASES", {"env": PHASES["env"], "first": Phase(slow), "second": Phase(slow),
                                              "third": Phase(slow)})
    status, _, _ = check(["--smoke", "--budget-s", "1.5", "--output", str(tmp_path)])
    phases = json.loads((tmp_path / "results.json").read_text())["phases"]
    assert status == 0 and [p["status"] for p in phases] == ["INFO", "INFO", "SKIP", "SKIP"]
    assert phases[2]["summary"] == "deadline: 0 s predicted, 0 s of the 1.5 s budget left"


def test_a_phase_predicted_to_outlast_the_budget_is_skipped_and_a_cheaper_one_after_it_runs(monkeypatch, tmp_path):
    ran = []

    def runs(ctx):
        ran.append(ctx)
        return PhaseResult("INFO", "ran")

    monkeypatch.setattr(gpu_check, "PHASES", {"env": PHASES["env"], "long": Phase(runs, full_s=1, smoke_s=600),
                                              "short": Phase(runs, full_s=600, smoke_s=1)})
    status, printed, _ = check(["--smoke", "--budget-s", "300", "--output", str(tmp_path)])
    phases = json.loads((tmp_path / "results.json").read_text())["phases"]
    assert status == 0 and [p["status"] for p in phases] == ["INFO", "SKIP", "INFO"] and len(ran) == 1
    summary = phases[1]["summary"]
    assert summary.startswith("deadline: 600 s predicted, ") and summary.endswith(" s of the 300 s budget left")
    assert phases[2]["predicted_s"] == 1 and "plan (smoke): env 1 s, long 600 s, short 1 s; 602 s predicted" in printed


def test_phases_runs_some_phases_again_after_env(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_check, "PHASES", {"env": PHASES["env"], "a": Phase(lambda ctx: PhaseResult("INFO", "a")),
                                              "b": Phase(lambda ctx: PhaseResult("INFO", "b"))})
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


def test_the_check_is_a_console_script_and_a_subcommand_of_convit_edu(monkeypatch):
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["convit-edu-check-gpu"] == "convit_edu.gpu_check:main"
    assert "check-gpu" in build_parser().format_help()
    started = []  # `convit-edu check-gpu FLAGS` starts `python -m convit_edu.gpu_check FLAGS`, and returns its status
    monkeypatch.setattr(cli.subprocess, "run", lambda argv: started.append(argv) or SimpleNamespace(returncode=2))
    flags = ["--smoke", "--phases", "env", "gpsa", "--budget-s", "5", "--output", "a folder"]
    assert cli.main(["check-gpu", *flags]) == 2 and started == [[sys.executable, "-m", "convit_edu.gpu_check", *flags]]


def test_convit_edu_check_gpu_help_is_the_checks_help():
    shown = subprocess.run([sys.executable, "-m", "convit_edu.cli", "check-gpu", "--help"], capture_output=True,
                           text=True)
    assert shown.returncode == 0 and shown.stdout.startswith("usage: convit-edu-check-gpu"), shown.stderr
    assert all(f"--{flag}" in shown.stdout for flag in ("smoke", "budget-s", "output", "phases"))


def test_without_a_gpu_the_full_check_fails_env_and_skips_every_other_phase(monkeypatch, tmp_path):
    """On a machine whose torch sees no GPU, `convit-edu-check-gpu` (not --smoke) says so once and runs nothing else."""
    ran = []
    monkeypatch.setattr(gpu_check, "collect_environment", lambda: {**collect_environment(), "gpu": None})
    monkeypatch.setattr(gpu_check, "PHASES", {"env": PHASES["env"], "gpsa": Phase(lambda ctx: ran.append(ctx))})
    status, printed, _ = check(["--output", str(tmp_path / "out")])
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert status == 1 and ran == [] and [(p["name"], p["status"]) for p in results["phases"]] == [
        ("env", "FAIL"), ("gpsa", "SKIP")]
    assert "sees no GPU" in results["phases"][0]["summary"] and "--smoke" in results["phases"][1]["summary"]
