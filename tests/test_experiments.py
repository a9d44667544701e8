"""Tests for convit_edu.experiments: grids of runs to CLI commands the real parser reads back, the Table 2/3
grids, collecting logs into tables, the relative gain."""

import json
import shlex
from dataclasses import replace

import pytest

from convit_edu.config import TrainConfig
from convit_edu.config_words import config_from_words
from convit_edu.experiment_design import (ABLATIONS, RunSpec, Scale, ablation_grid, commands_script,
                                          sample_efficiency_grid, sample_efficiency_scale, train_command, unique_runs)
from convit_edu.files import write_json
from convit_edu.experiments import collect, expected_hours, read_run, run_config, run_grid
from convit_edu.tables import format_table_2, format_table_3, relative_gain, table_2, table_3, unseen_top1

SCALE = Scale(convit="convit_tiny", deit="deit_tiny", epochs=10, warmup_epochs=1, convit_args={"local_up_to_layer": 4},
              common={"data": "fake", "batch_size": 32, "model_args": {"patch_size": 8, "embed_dim": 96}})


def parse(command: str) -> TrainConfig:
    """The config `convit-edu train` reads from a grid's command (config_from_words, the CLI's own code)."""
    words = shlex.split(command)
    assert words[:4] == ["python", "-m", "convit_edu.cli", "train"]
    return config_from_words(words[4:])


def test_train_command_words_read_back_into_the_runs_config():
    spec = RunSpec("r1", "x", TrainConfig(model="convit_small", epochs=3, lr=1e-3, ema_decay=0.999,
                                          model_args={"freeze_gating": True, "use_local_init": False},
                                          aug_args={"scale": (0.35, 1.0)}, data_args={"num_train": 64}))
    command = train_command(spec, "out/dir")
    assert "--freeze-gating --no-use-local-init" in command and "--data-arg num_train=64" in command
    assert parse(command) == replace(spec.config, output="out/dir/r1")


def test_train_command_quotes_paths_and_keeps_the_launcher():
    spec = RunSpec("r", "x", TrainConfig(data="imagefolder", data_root="my data"))
    command = train_command(spec, "res", launcher="OMP_NUM_THREADS=1 torchrun --nproc_per_node=8 -m convit_edu.cli")
    assert command.startswith("OMP_NUM_THREADS=1 torchrun --nproc_per_node=8 -m convit_edu.cli train ")
    assert "--data-root 'my data'" in command


def test_run_spec_rejects_bad_values():
    with pytest.raises(ValueError, match="folder name"):
        RunSpec("a/b", "x", TrainConfig())
    with pytest.raises(ValueError, match="leave its config's output at 'runs/run', not 'elsewhere'"):
        RunSpec("a", "x", TrainConfig(output="elsewhere"))
    with pytest.raises(TypeError, match="its config must be a TrainConfig"):
        RunSpec("a", "x", {"lr": 1e-3})
    with pytest.raises(ValueError, match="unknown preset 'jft'"):
        RunSpec("a", "x", TrainConfig(), preset="jft")
    with pytest.raises(ValueError, match="lacks 'patch_size', which preset cifar100-32 sets"):
        RunSpec("a", "x", TrainConfig(img_size=32), preset="cifar100-32")


def test_sample_efficiency_grid_scales_epochs_and_warmup_by_one_over_f():
    runs = sample_efficiency_grid(SCALE, [0.1, 0.5, 1.0])
    assert [r.name for r in runs] == ["deit_f0.1_s0", "convit_f0.1_s0", "deit_f0.5_s0", "convit_f0.5_s0", "deit_f1_s0",
                                      "convit_f1_s0"]
    by_name = {r.name: r.config for r in runs}
    assert by_name["convit_f0.1_s0"].epochs == 100
    assert by_name["convit_f0.1_s0"].warmup_epochs == pytest.approx(10)
    assert by_name["deit_f0.5_s0"].epochs == 20 and by_name["deit_f1_s0"].fraction == 1.0
    assert by_name["convit_f1_s0"].model_args["local_up_to_layer"] == 4
    assert "local_up_to_layer" not in by_name["deit_f1_s0"].model_args
    assert by_name["deit_f1_s0"].model == "deit_tiny" and by_name["deit_f1_s0"].model_args["embed_dim"] == 96
    assert [r.name for r in sample_efficiency_grid(SCALE, [1.0], seeds=[3, 4])] == [
        "deit_f1_s3", "convit_f1_s3", "deit_f1_s4", "convit_f1_s4"]
    assert sample_efficiency_grid(SCALE, [1.0], seeds=[3])[0].config.seed == 3


def test_with_class_sizes_every_fraction_makes_the_same_optimiser_steps():
    scale = Scale(convit="convit_tiny", deit="deit_tiny", epochs=24, warmup_epochs=2, class_sizes=(500,) * 10,
                  common={"global_batch": 128})
    steps_per_epoch = {1.0: 39, 0.3: 11, 0.1: 3}  # the loader drops each epoch's last partial batch
    for f, per_epoch in steps_per_epoch.items():
        plan = scale.schedule(f)
        assert abs(plan["epochs"] * per_epoch - 24 * 39) < per_epoch, f
        assert plan["warmup_epochs"] * per_epoch == pytest.approx(2 * 39), f
        assert plan["eval_every"] == round(39 / per_epoch), f
    with pytest.raises(ValueError, match="fraction 0.02 keeps fewer than one batch of 128"):
        scale.schedule(0.02)
    with pytest.raises(ValueError, match="needs a global_batch"):
        replace(scale, common={}).schedule(1.0)


def test_ablation_grid_sets_the_table_3_switches():
    runs = {r.name: r for r in ablation_grid(SCALE, 0.1, names=list(ABLATIONS))}
    assert runs["frozen_gate_f0.1_s0"].config.model_args["freeze_gating"] is True
    assert runs["no_conv_init_f0.1_s0"].config.model_args["use_local_init"] is False
    frozen_no_init = runs["frozen_gpsa_no_conv_init_f0.1_s0"].config.model_args
    assert frozen_no_init["freeze_gpsa"] and not frozen_no_init["use_local_init"]
    assert runs["psa_f0.1_s0"].config.model_args["local_attention"] == "psa"
    for name, spec in runs.items():  # the command trains what the runner trains
        assert parse(train_command(spec, "res")) == run_config(spec, f"res/{name}"), name
    with pytest.raises(ValueError, match="unknown ablation 'e': choose one of convit, frozen_gate"):
        SCALE.run("e", 0.1)


def test_the_deit_row_is_the_ablation_that_builds_the_deit():
    assert [name for name, a in ABLATIONS.items() if a.model == "deit"] == ["deit"]
    assert [a.table_ref for a in ABLATIONS.values()] == ["a", "b", "c", "d", "e", "f", "g", "App. A"]
    deit, convit = SCALE.run("deit", 1.0).config, SCALE.run("convit", 1.0).config
    assert deit.model == "deit_tiny" and "local_up_to_layer" not in deit.model_args  # the ConViT's own args stay off
    assert convit.model == "convit_tiny" and convit.model_args["local_up_to_layer"] == 4
    assert replace(convit, model="deit_tiny", model_args=deit.model_args) == deit


def test_unique_runs_merges_the_shared_runs_and_rejects_clashes():
    merged = unique_runs(sample_efficiency_grid(SCALE, [0.1]),
                         ablation_grid(SCALE, 0.1, names=["convit", "frozen_gate", "deit"]))
    assert [r.name for r in merged] == ["deit_f0.1_s0", "convit_f0.1_s0", "frozen_gate_f0.1_s0"]
    with pytest.raises(ValueError, match="both named 'x'"):
        unique_runs([RunSpec("x", "1", TrainConfig(lr=1.0))], [RunSpec("x", "2", TrainConfig(lr=2.0))])


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
    write_run(tmp_path / "deit_f1_s0", "deit_tiny", 1.0, 2, [20.0, 30.0])
    write_run(tmp_path / "convit_f1_s0", "convit_tiny", 1.0, 2, [25.0, 36.0])
    write_run(tmp_path / "convit_f0.5_s0", "convit_tiny", 0.5, 4, [10.0])
    with pytest.warns(UserWarning, match=r"not run \['deit_f0.5_s0'\], unfinished \['convit_f0.5_s0 \(1/4 epochs\)'\]"):
        results = collect(tmp_path, runs)
    assert set(results) == {"deit_f1_s0", "convit_f1_s0", "convit_f0.5_s0"}
    assert results["convit_f1_s0"].top1 == 36.0 and results["convit_f1_s0"].top5 == 46.0
    assert results["convit_f1_s0"].finished and not results["convit_f0.5_s0"].finished


def test_read_run_refuses_a_folder_holding_another_run(tmp_path):
    write_run(tmp_path / "deit_f1_s0", "convit_tiny", 1.0, 1, [1.0])
    with pytest.raises(ValueError, match="holds a convit_tiny on fraction 1.0, not run 'deit_f1_s0'"):
        read_run(tmp_path / "deit_f1_s0", SCALE.run("deit", 1.0))


def test_relative_gain_matches_table_2_of_the_paper():
    assert round(relative_gain(47.8, 34.8)) == 37  # f = 5 %, top-1
    assert round(relative_gain(81.4, 79.9)) == 2  # f = 100 %
    with pytest.raises(ValueError, match="DeiT accuracy 0"):
        relative_gain(1.0, 0.0)


# ------------------------------------------------------------------ the grid as one command, and its records


def record(model: str, fraction: float, seed: int, val: float, heldout: float | None, ablation=None,
           val_images=100, heldout_images=900, train_top1=99.0) -> dict:
    return {"name": f"{ablation or model}_f{fraction:g}_s{seed}", "model": model, "ablation": ablation,
            "fraction": fraction, "seed": seed, "val_top1": val, "val_images": val_images, "heldout_top1": heldout,
            "heldout_images": heldout_images if heldout is not None else 0, "train_top1": train_top1,
            "gates_start": [], "gates_end": []}


def test_test_top1_pools_validation_and_heldout_images():
    assert unseen_top1(record("deit", 0.1, 0, 50.0, 60.0)) == pytest.approx(59.0)  # (100·50 + 900·60) / 1000
    assert unseen_top1(record("deit", 1.0, 0, 50.0, None)) == 50.0


def test_table_2_pairs_seeds_and_combines_seed_and_binomial_noise():
    records = [record("deit", 0.1, 0, 40.0, 40.0), record("convit", 0.1, 0, 50.0, 50.0),
               record("deit", 0.1, 1, 40.0, 40.0), record("convit", 0.1, 1, 46.0, 46.0),
               record("convit", 1.0, 0, 70.0, None)]  # no DeiT at f = 1: no row
    (row,) = table_2(records)
    assert row["fraction"] == 0.1 and row["seeds"] == 2 and row["paired_seeds"] == [0, 1]
    assert row["diff"] == pytest.approx(8.0) and row["gain"] == pytest.approx(20.0)
    seed_se = 2.0  # differences 10 and 6: sd 2·√2, over √2
    binomial = ((50 * 50 + 40 * 60 + 46 * 54 + 40 * 60) / 1000) ** 0.5 / 2  # 4 scorings of 1000 images, mean of 2
    assert row["diff_se"] == pytest.approx((seed_se**2 + binomial**2) ** 0.5)
    assert row["test_images"] == 1000 and row["train_top1"] == {"convit": 99.0, "deit": 99.0}
    assert "10% " in format_table_2([row]) and "+8.0 ±" in format_table_2([row])


def test_table_3_keeps_the_ablations_of_one_fraction_in_the_papers_order():
    records = [record("convit", 0.1, 0, 50.0, 50.0, ablation="psa"), record("deit", 0.1, 0, 40.0, 40.0),
               record("convit", 0.1, 0, 55.0, 55.0), record("convit", 0.1, 0, 52.0, 52.0, ablation="frozen_gate"),
               record("convit", 1.0, 0, 70.0, None)]
    rows = table_3(records, 0.1)
    assert [r["name"] for r in rows] == ["convit", "frozen_gate", "deit", "psa"]
    assert [r["table_ref"] for r in rows] == ["a", "b", "e", "App. A"]
    assert "App. A PSA" in format_table_3(rows)


def test_run_config_is_the_runs_config_in_its_folder(tmp_path):
    spec = SCALE.run("frozen_gate", 0.5, seed=2)
    cfg = run_config(spec, tmp_path / spec.name, resume="auto")
    assert cfg == replace(spec.config, output=str(tmp_path / spec.name), resume="auto")
    assert parse(train_command(spec, tmp_path)) == replace(cfg, resume=None)  # what the script prints for it


def test_write_json_makes_its_folders_and_leaves_no_temporary_file(tmp_path):
    path = write_json(tmp_path / "a" / "b.json", {"x": (1, 2)})
    assert json.loads(path.read_text()) == {"x": [1, 2]} and [p.name for p in path.parent.iterdir()] == ["b.json"]


def jpeg_folder(root, classes=3, train=24, val=6, size=32):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", train), ("val", val)):
        for c in range(classes):
            (root / split / f"c{c}").mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 50, (size, size, 3)) + 70 * c
                Image.fromarray(pixels.astype("uint8")).save(root / split / f"c{c}" / f"{i:03d}.jpg")
    return root


def tiny_scale(root):
    return sample_efficiency_scale(root, classes=3, images_per_run=96, warmup_images=0, global_batch=12,
                                   num_workers=0, progress="none", img_size=32)


def test_the_grid_writes_a_summary_per_run_and_resumes_where_it_stopped(tmp_path, capsys, monkeypatch):
    root, output = jpeg_folder(tmp_path / "data"), tmp_path / "out"
    scale = tiny_scale(root)
    assert scale.class_sizes == (24, 24, 24) and scale.base.model_args["num_heads"] == 9
    runs = sample_efficiency_grid(scale, [0.5, 1.0])
    records = run_grid(runs, output, records=3)
    assert "0 of 4 runs already finished" in capsys.readouterr().out
    assert [(r["model"], r["fraction"]) for r in records] == [("convit", 0.5), ("deit", 0.5), ("convit", 1.0),
                                                              ("deit", 1.0)]  # fraction, then Table 3's order
    half = records[0]
    assert half["heldout_images"] == 36 and half["train_images"] == 36 and half["val_images"] == 18
    assert len(half["gates_start"]) == 4 and records[1]["gates_start"] == [] and half["ablation"] is None
    assert records[2]["heldout_top1"] is None and records[2]["heldout_images"] == 0
    assert json.loads((output / "summary.json").read_text()) == records
    for name in ("table.txt", "sample_efficiency.png", "nonlocality.png", "gates.png"):
        assert (output / name).is_file(), name
    steps = [json.loads((output / s.name / "log.jsonl").read_text().splitlines()[-1])["step"] for s in runs]
    assert max(steps) - min(steps) < 3  # equal compute at both fractions
    for spec in runs:  # each run trained the config its printed command gives (--resume auto aside)
        recorded = TrainConfig.from_dict(json.loads((output / spec.name / "run.json").read_text())["config"])
        assert replace(recorded, resume=None) == parse(train_command(spec, output)), spec.name

    (output / "convit_f1_s0" / "record.json").unlink()  # as if stopped after training, before scoring
    import convit_edu.experiments as experiments

    trained = []
    real_train = experiments.train
    monkeypatch.setattr(experiments, "train", lambda cfg, **kw: trained.append(cfg.output) or real_train(cfg, **kw))
    again = run_grid(runs, output, records=3)
    assert "3 of 4 runs already finished" in capsys.readouterr().out
    assert trained == [str(output / "convit_f1_s0")]  # only the unfinished run, from its last.pt
    assert again == records  # nothing left to train: the resumed run scores the same weights


def test_the_grid_refuses_a_folder_of_runs_trained_with_other_settings(tmp_path, capsys, monkeypatch):
    import convit_edu.experiments as experiments

    root, output = jpeg_folder(tmp_path / "data"), tmp_path / "out"

    def grid(**changes):
        scale = sample_efficiency_scale(root, classes=3, images_per_run=96, warmup_images=0, **{
            "global_batch": 12, "num_workers": 0, "progress": "none", "img_size": 32, **changes})
        return sample_efficiency_grid(scale, [1.0])[:1]  # deit_f1_s0

    run_grid(grid(), output, records=2)
    trained = []
    monkeypatch.setattr(experiments, "train", lambda cfg, **kw: trained.append(cfg.output))
    with pytest.raises(ValueError, match=r"deit_f1_s0 holds a run trained with other settings \(img_size: 32 -> 40\)"
                                         r".*choose another --output or delete"):
        run_grid(grid(img_size=40), output)
    with pytest.raises(ValueError, match=r"global batch: 12 -> 24") as refused:
        run_grid(grid(global_batch=24), output)
    assert "batch_size" not in str(refused.value)  # the global batch, once, not the settings that make it
    with pytest.raises(ValueError) as refused:
        run_grid(grid(lr=2e-3, model_args={**grid()[0].config.model_args, "depth": 5}), output)
    assert "lr: 0.016 -> 0.002" in str(refused.value) and "'depth': 6} -> {" in str(refused.value)
    capsys.readouterr()
    run_grid(grid(num_workers=1, device="cpu"), output)  # what a resumed run may change: skipped as finished
    assert "1 of 1 runs already finished" in capsys.readouterr().out
    (output / "deit_f1_s0" / "record.json").unlink()  # a run stopped part-way is refused too
    with pytest.raises(ValueError, match="img_size: 32 -> 40"):
        run_grid(grid(img_size=40), output)
    assert trained == []


def test_expected_hours_uses_finished_runs_of_the_same_model_on_this_kind_of_device(tmp_path):
    root = jpeg_folder(tmp_path / "data")
    runs = sample_efficiency_grid(tiny_scale(root), [0.5, 1.0])
    for name, device, hours in [("deit_f1_s0", "cpu", 2.0), ("deit_f1_s1", "cuda:0", 0.1), ("convit_f1_s0", "cuda", 1)]:
        (tmp_path / "out" / name).mkdir(parents=True)
        (tmp_path / "out" / name / "record.json").write_text(json.dumps({"name": name, "hours": hours}))
        (tmp_path / "out" / name / "run.json").write_text(json.dumps({"device": device}))
    hours, how = expected_hours([runs[0]], tmp_path / "out")  # deit_f0.5_s0: like the DeiT finished on a CPU
    assert hours == 2.0 and how == "finished runs on cpu"
    hours, how = expected_hours([runs[1]], tmp_path / "out")  # the ConViT finished on a GPU only: a measured step
    assert 0 < hours < 1 and "measured now" in how


def test_expected_hours_counts_only_the_epochs_a_part_trained_run_has_left(tmp_path):
    from convit_edu.run_state import CHECKPOINT_FORMAT, CHECKPOINT_KEYS, save_checkpoint

    runs = sample_efficiency_grid(tiny_scale(jpeg_folder(tmp_path / "data")), [0.5, 1.0])
    (tmp_path / "out" / "deit_f1_s0").mkdir(parents=True)
    (tmp_path / "out" / "deit_f1_s0" / "record.json").write_text(json.dumps({"name": "deit_f1_s0", "hours": 2.0}))
    (tmp_path / "out" / "deit_f1_s0" / "run.json").write_text(json.dumps({"device": "cpu"}))
    epochs = runs[0].config.epochs
    assert runs[0].name == "deit_f0.5_s0" and epochs >= 2
    whole, _ = expected_hours([runs[0]], tmp_path / "out")
    (tmp_path / "out" / runs[0].name).mkdir()
    save_checkpoint({**dict.fromkeys(CHECKPOINT_KEYS), "format": CHECKPOINT_FORMAT, "epoch": 1},
                    tmp_path / "out" / runs[0].name / "last.pt")
    hours, how = expected_hours([runs[0]], tmp_path / "out")
    assert whole == 2.0 and hours == pytest.approx(2.0 * (epochs - 1) / epochs) and how == "finished runs on cpu"


def test_run_budget_counts_whole_steps_of_the_kept_images_and_their_rates():
    from convit_edu.experiments import run_budget
    from convit_edu.optimisation import learning_rate_sum

    cfg = TrainConfig(global_batch=32, epochs=3, fraction=0.1, lr=1e-2, warmup_epochs=1)
    images, rates = run_budget(cfg, [351] * 10)  # ⌊35.1⌋ × 10 = 350 images an epoch: 10 whole steps of 32
    assert images == 3 * 10 * 32 and rates == learning_rate_sum(cfg, 10)
    assert run_budget(replace(cfg, fraction=1.0), [351] * 10)[0] == 3 * (3510 // 32) * 32


def test_a_run_with_faster_gates_records_and_prints_the_gates_learning_rate_sum(tmp_path, capsys):
    from convit_edu.cli import main

    root = jpeg_folder(tmp_path / "data", classes=2, train=64, val=4)
    code = main(["experiment", "ablations", "--data-root", str(root), "--classes", "2", "--seeds", "0",
                 "--fraction", "1", "--names", "convit", "--images-per-run", "64", "--num-workers", "0",
                 "--progress", "none", "--output", str(tmp_path / "out"), "--test-per-class", "0",
                 "--set", "gate_lr_scale=10"])
    out = capsys.readouterr().out
    record = json.loads((tmp_path / "out" / "convit_f1_s0" / "record.json").read_text())
    assert code == 0 and record["gate_lr_sum"] == pytest.approx(10 * record["lr_sum"]) and record["lr_sum"] > 0
    assert f"learning-rate sum {record['lr_sum']:.2f}, the gates' {record['gate_lr_sum']:.2f})" in out


def test_the_experiment_command_runs_a_grid_and_prints_its_table(tmp_path, capsys):
    from convit_edu.cli import main

    root = jpeg_folder(tmp_path / "data", classes=2, train=128, val=4)  # f = 0.5 keeps one batch of 128
    code = main(["experiment", "ablations", "--data-root", str(root), "--classes", "2", "--seeds", "0",
                 "--fraction", "0.5", "--names", "convit", "psa", "--images-per-run", "128", "--num-workers", "0",
                 "--progress", "none", "--output", str(tmp_path / "out"), "--test-per-class", "0"])
    out = capsys.readouterr().out
    assert code == 0 and "App. A PSA" in out and "ConViT" in out
    assert "convit_f0.5_s0 (ConViT, 2 epochs: 256 images, learning-rate sum" in out  # each run's budget, first
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [(r["ablation"], r["heldout_images"]) for r in summary] == [(None, 128), ("psa", 128)]
    code = main(["experiment", "sample-efficiency", "--data-root", str(tmp_path / "nowhere"), "--output",
                 str(tmp_path / "o")])
    assert code == 1 and "no folder" in capsys.readouterr().err


@pytest.mark.parametrize("setting", [["--set", "lr=-1"], ["--model-arg", "depthh=3"], ["--warmup-images", "-1"]])
def test_a_mistyped_setting_is_refused_before_the_split_is_made(tmp_path, capsys, setting):
    from convit_edu.cli import main

    root = jpeg_folder(tmp_path / "data", train=12)
    argv = ["experiment", "sample-efficiency", "--data-root", str(root), "--classes", "3", "--test-per-class", "4",
            "--dev-per-class", "2", "--output", str(tmp_path / "grid"), *setting]
    assert main(argv) == 1
    expected = {"--set": "error: lr must be", "--model-arg": "depthh", "--warmup-images": "--warmup-images must be"}
    assert expected[setting[0]] in capsys.readouterr().err  # the words of the flag that was wrong
    assert not (tmp_path / "grid").exists()  # no split in OUTPUT/data to refuse the corrected command


def test_warmup_images_sets_the_warm_up_of_every_run_in_steps(tmp_path, capsys):
    from convit_edu.cli import main

    root = jpeg_folder(tmp_path / "data", classes=2, train=64, val=4)
    argv = ["experiment", "ablations", "--data-root", str(root), "--classes", "2", "--seeds", "0", "--fraction", "1",
            "--names", "convit", "--images-per-run", "64", "--num-workers", "0", "--progress", "none",
            "--test-per-class", "0", "--set", "global_batch=16"]
    for images, folder in (("0", "none"), ("32", "half")):
        assert main(argv + ["--warmup-images", images, "--output", str(tmp_path / folder)]) == 0
    warmups = [json.loads((tmp_path / f / "convit_f1_s0" / "run.json").read_text())["config"]["warmup_epochs"]
               for f in ("none", "half")]
    assert warmups == [0, 0.25]  # 32 of the 128 training images: a quarter of an epoch


def test_per_image_correct_scores_under_the_precision_auto_resolves_to_not_under_fp16(monkeypatch):
    """"auto" is bf16 on a GPU (fp32 or bf16 on a CPU); read as a dtype it would have been fp16 (devices.autocast)."""
    import torch
    from torch.utils.data import TensorDataset

    from convit_edu import experiments
    from convit_edu.devices import resolve_precision

    asked = []
    monkeypatch.setattr(experiments, "autocast", lambda device, precision: asked.append(precision) or
                        torch.autocast(device.type, enabled=False))
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2))
    data = TensorDataset(torch.randn(6, 1, 2, 2), torch.tensor([0, 1, 0, 1, 0, 1]))
    correct = experiments.per_image_correct(model, data, batch_size=4, precision="auto")
    assert len(correct) == 6 and set(correct) <= {"0", "1"}
    assert asked == [resolve_precision("auto", "cpu")] * 2 and "auto" not in asked
