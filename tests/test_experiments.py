"""Tests for convit_edu.experiments: grids of runs to CLI commands the real parser reads back, the Table 2/3
grids, collecting logs into tables, the relative gain."""

import json
import shlex

import pytest

from convit_edu.cli import build_parser
from convit_edu.experiments import (
    ABLATIONS,
    RunSpec,
    Scale,
    ablation_grid,
    collect,
    commands_script,
    format_sample_efficiency,
    read_run,
    relative_gain,
    sample_efficiency_grid,
    train_command,
    unique_runs,
)

SCALE = Scale(convit="convit_tiny", deit="deit_tiny", epochs=10, warmup_epochs=1,
              model_args={"patch_size": 8, "embed_dim": 64}, convit_args={"local_up_to_layer": 4},
              common={"data": "fake", "batch_size": 32})


def parse(command: str):
    words = shlex.split(command)
    assert words[:4] == ["python", "-m", "convit_edu.cli", "train"]
    return vars(build_parser().parse_args(words[3:]))


def test_train_command_flags_are_read_back_by_the_cli_parser():
    spec = RunSpec("r1", "x", {"model": "convit_tiny", "epochs": 3, "lr": 1e-3, "freeze_gating": True,
                               "use_local_init": False, "ema_decay": None, "data_args": {"num_train": 64}})
    args = parse(train_command(spec, "out/dir"))
    assert args["model"] == "convit_tiny" and args["epochs"] == 3 and args["lr"] == 1e-3
    assert args["model.freeze_gating"] is True and args["model.use_local_init"] is False
    assert args["ema_decay"] is None and args["data_arg"] == ["num_train=64"]
    assert args["output"] == "out/dir/r1"


def test_train_command_quotes_paths_and_keeps_the_launcher():
    spec = RunSpec("r", "x", {"data_root": "my data"})
    command = train_command(spec, "res", launcher="OMP_NUM_THREADS=1 torchrun --nproc_per_node=8 -m convit_edu.cli")
    assert command.startswith("OMP_NUM_THREADS=1 torchrun --nproc_per_node=8 -m convit_edu.cli train ")
    assert "--data-root 'my data'" in command


def test_run_spec_and_flags_reject_bad_values():
    with pytest.raises(ValueError, match="folder name"):
        RunSpec("a/b", "x")
    with pytest.raises(ValueError, match="do not set 'output'"):
        RunSpec("a", "x", {"output": "elsewhere"})
    with pytest.raises(TypeError, match="flag 'model_args'"):
        train_command(RunSpec("a", "x", {"model_args": {"depth": 2}}), "res")


def test_sample_efficiency_grid_scales_epochs_and_warmup_by_one_over_f():
    runs = sample_efficiency_grid(SCALE, [0.1, 0.5, 1.0])
    assert [r.name for r in runs] == ["deit_f0.1", "convit_f0.1", "deit_f0.5", "convit_f0.5", "deit_f1", "convit_f1"]
    by_name = {r.name: r.flags for r in runs}
    assert by_name["convit_f0.1"]["epochs"] == 100 and by_name["convit_f0.1"]["warmup_epochs"] == pytest.approx(10)
    assert by_name["deit_f0.5"]["epochs"] == 20 and by_name["deit_f1"]["fraction"] == 1.0
    assert by_name["convit_f1"]["local_up_to_layer"] == 4 and "local_up_to_layer" not in by_name["deit_f1"]
    assert by_name["deit_f1"]["model"] == "deit_tiny" and by_name["deit_f1"]["embed_dim"] == 64


def test_ablation_grid_sets_the_table_3_switches():
    runs = {r.name: r for r in ablation_grid(SCALE, 0.1, names=list(ABLATIONS))}
    assert runs["frozen_gate_f0.1"].flags["freeze_gating"] is True
    assert runs["no_conv_init_f0.1"].flags["use_local_init"] is False
    frozen_no_init = runs["frozen_gpsa_no_conv_init_f0.1"].flags
    assert frozen_no_init["freeze_gpsa"] and not frozen_no_init["use_local_init"]
    assert runs["psa_f0.1"].flags["local_attention"] == "psa"
    for name, spec in runs.items():  # every run is a valid CLI invocation
        parse(train_command(spec, "res"))
    with pytest.raises(ValueError, match="unknown ablation 'e': choose one of convit, frozen_gate"):
        SCALE.run("e", 0.1)


def test_the_deit_row_is_the_ablation_that_builds_the_deit():
    assert [name for name, a in ABLATIONS.items() if a.model == "deit"] == ["deit"]
    assert [a.table_ref for a in ABLATIONS.values()] == ["a", "b", "c", "d", "e", "f", "g", "App. A"]
    deit, convit = SCALE.run("deit", 1.0).flags, SCALE.run("convit", 1.0).flags
    assert deit["model"] == "deit_tiny" and "local_up_to_layer" not in deit  # the ConViT's own args stay off
    assert convit["model"] == "convit_tiny" and convit["local_up_to_layer"] == 4
    assert {k: v for k, v in deit.items() if k != "model"} == {
        k: v for k, v in convit.items() if k not in ("model", "local_up_to_layer")}


def test_unique_runs_merges_the_shared_runs_and_rejects_clashes():
    merged = unique_runs(sample_efficiency_grid(SCALE, [0.1]),
                         ablation_grid(SCALE, 0.1, names=["convit", "frozen_gate", "deit"]))
    assert [r.name for r in merged] == ["deit_f0.1", "convit_f0.1", "frozen_gate_f0.1"]
    with pytest.raises(ValueError, match="both named 'x'"):
        unique_runs([RunSpec("x", "1", {"lr": 1})], [RunSpec("x", "2", {"lr": 2})])


def test_commands_script_runs_every_command_in_order_and_stops_on_failure():
    runs = sample_efficiency_grid(SCALE, [1.0])
    script = commands_script(runs, "res", setup=["echo setup"])
    lines = script.splitlines()
    assert lines[0] == "#!/usr/bin/env bash" and "set -euo pipefail" in lines and lines[3] == "echo setup"
    assert lines[4:] == [train_command(r, "res") for r in runs]


def write_run(folder, model: str, fraction: float, epochs: int, top1: list[float]):
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"config": {"model": model, "fraction": fraction, "epochs": epochs}}))
    rows = [{"epoch": i + 1, "val_top1": t, "val_top5": t + 10, "epoch_time_s": 36.0} for i, t in enumerate(top1)]
    (folder / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_collect_reads_logs_and_warns_about_missing_and_unfinished_runs(tmp_path):
    runs = sample_efficiency_grid(SCALE, [0.5, 1.0])
    write_run(tmp_path / "deit_f1", "deit_tiny", 1.0, 2, [20.0, 30.0])
    write_run(tmp_path / "convit_f1", "convit_tiny", 1.0, 2, [25.0, 36.0])
    write_run(tmp_path / "convit_f0.5", "convit_tiny", 0.5, 4, [10.0])
    with pytest.warns(UserWarning, match=r"not run \['deit_f0.5'\], unfinished \['convit_f0.5 \(1/4 epochs\)'\]"):
        results = collect(tmp_path, runs)
    assert set(results) == {"deit_f1", "convit_f1", "convit_f0.5"}
    assert results["convit_f1"].top1 == 36.0 and results["convit_f1"].top5 == 46.0
    assert results["convit_f1"].finished and not results["convit_f0.5"].finished
    assert results["deit_f1"].hours == pytest.approx(0.02)


def test_read_run_refuses_a_folder_holding_another_run(tmp_path):
    write_run(tmp_path / "deit_f1", "convit_tiny", 1.0, 1, [1.0])
    with pytest.raises(ValueError, match="holds a convit_tiny on fraction 1.0, not run 'deit_f1'"):
        read_run(tmp_path / "deit_f1", SCALE.run("deit", 1.0))


def test_sample_efficiency_table_gap_is_the_papers_relative_improvement(tmp_path):
    from convit_edu.experiments import sample_efficiency_table

    write_run(tmp_path / "deit_f1", "deit_tiny", 1.0, 1, [40.0])
    write_run(tmp_path / "convit_f1", "convit_tiny", 1.0, 1, [50.0])
    write_run(tmp_path / "deit_f0.5", "deit_tiny", 0.5, 2, [30.0, 35.0])
    write_run(tmp_path / "convit_f0.5", "convit_tiny", 0.5, 2, [45.0])  # unfinished: no row for f = 0.5
    with pytest.warns(UserWarning, match="unfinished"):
        results = collect(tmp_path, sample_efficiency_grid(SCALE, [0.5, 1.0]))
    rows = sample_efficiency_table(results, SCALE, [0.5, 1.0])
    assert len(rows) == 1 and rows[0]["gap_top1"] == pytest.approx(25.0) and rows[0]["gap_top5"] == pytest.approx(20.0)
    assert "100% |   40.0    50.0    25% |   50.0    60.0    20%" in format_sample_efficiency(rows)


def test_relative_gain_matches_table_2_of_the_paper():
    assert round(relative_gain(47.8, 34.8)) == 37  # f = 5 %, top-1
    assert round(relative_gain(81.4, 79.9)) == 2  # f = 100 %
    with pytest.raises(ValueError, match="DeiT accuracy 0"):
        relative_gain(1.0, 0.0)
