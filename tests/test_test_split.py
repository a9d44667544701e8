"""The experiment's fixed test split (one test set for every fraction), per-image scoring, and Tables 2 and 3
compared image by image on it."""

import json
import os

import pytest
import torch

from convit_edu.datasets import ImageFolderDataset
from convit_edu.experiments import fixed_test_split, per_image_correct
from convit_edu.tables import check_preconditions, compare, format_table_3, plot_table_3, table_2, table_3
from test_experiments import jpeg_folder


def files(root, split):
    return {os.path.realpath(p) for p, _ in ImageFolderDataset(root / split).samples}


def test_the_split_sets_aside_the_same_test_images_whatever_trains(tmp_path):
    source = jpeg_folder(tmp_path / "src", classes=3, train=12, val=3)
    dest = fixed_test_split(source, tmp_path / "split", classes=2, test_per_class=4, dev_per_class=2)
    train, dev, test = (files(dest, s) for s in ("train", "val", "test"))
    assert (len(train), len(dev), len(test)) == (2 * 6, 2 * 2, 2 * (4 + 3))
    assert not (train & dev or train & test or dev & test)
    assert files(source, "val") - test == {os.path.realpath(p) for p in (source / "val" / "c2").iterdir()}
    last = sorted((source / "train" / "c0").iterdir())[-4:]  # a class's last training images are test images
    assert {os.path.realpath(p) for p in last} <= test
    assert json.loads((dest / "split.json").read_text())["test_images"] == 14
    assert fixed_test_split(source, dest, classes=2, test_per_class=4, dev_per_class=2) == dest  # made: kept
    with pytest.raises(ValueError, match="holds another split"):
        fixed_test_split(source, dest, classes=2, test_per_class=5, dev_per_class=2)
    with pytest.raises(ValueError, match="class 'c0' has 12 training images"):
        fixed_test_split(source, tmp_path / "other", classes=2, test_per_class=10, dev_per_class=2)


def test_a_split_from_another_first_class_holds_those_classes_and_refuses_too_few(tmp_path):
    source = jpeg_folder(tmp_path / "src", classes=4, train=8, val=2)
    dest = fixed_test_split(source, tmp_path / "split", classes=2, test_per_class=2, dev_per_class=1, first_class=2)
    for split in ("train", "val", "test"):
        assert sorted(p.name for p in (dest / split).iterdir()) == ["c2", "c3"]
    assert json.loads((dest / "split.json").read_text())["first_class"] == 2
    with pytest.raises(ValueError, match="holds another split"):
        fixed_test_split(source, dest, classes=2, test_per_class=2, dev_per_class=1, first_class=1)
    with pytest.raises(ValueError, match="max_classes 5 is larger than the 4 classes"):
        fixed_test_split(source, tmp_path / "other", classes=2, test_per_class=2, dev_per_class=1, first_class=3)


def test_a_split_made_before_first_class_existed_is_read_as_starting_at_class_0(tmp_path):
    source = jpeg_folder(tmp_path / "src", classes=2, train=8, val=2)
    dest = fixed_test_split(source, tmp_path / "split", classes=2, test_per_class=2, dev_per_class=1)
    made = json.loads((dest / "split.json").read_text())
    del made["first_class"]
    (dest / "split.json").write_text(json.dumps(made))
    assert fixed_test_split(source, dest, classes=2, test_per_class=2, dev_per_class=1) == dest


def test_per_image_correct_lists_each_images_top1_hit_in_order():
    images = torch.randn(5, 3, 4, 4)
    labels = torch.tensor([0, 1, 1, 0, 1])
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 2))
    dataset = torch.utils.data.TensorDataset(images, labels)
    expected = "".join("1" if h else "0" for h in (model(images).argmax(1) == labels).tolist())
    assert per_image_correct(model, dataset, batch_size=2) == expected


def test_comparing_image_by_image_sees_through_images_both_models_get_right_or_wrong():
    g = torch.Generator().manual_seed(0)
    deit = (torch.rand(3, 2000, generator=g) < 0.5).long()
    convit = deit.clone()
    convit[:, :40], deit[:, :40] = 1, 0  # the ConViT alone gets the first 40 right: a 2-point difference
    records = [{"model": m, "ablation": None, "fraction": 0.1, "seed": s, "test_top1": 100 * run.float().mean().item(),
                "test_correct": "".join(map(str, run.tolist()))} for m, runs in (("convit", convit), ("deit", deit))
               for s, run in enumerate(runs)]
    c = compare(records[:3], records[3:], None)
    assert c["diff"] == pytest.approx(2.0)
    unpaired_se = (2 * 50 * 50 / 2000 / 3) ** 0.5  # binomial noise of two independent ~50 % scores: 0.91
    assert 0.15 < c["se_images"] < 0.45 < unpaired_se  # image by image: about sqrt(40)/2000 = 0.32 points


def test_table_2_pairs_runs_that_saved_their_test_answers():
    def record(model, seed, correct):
        return {"model": model, "ablation": None, "fraction": 0.1, "seed": seed, "train_top1": 99.0,
                "test_correct": correct, "test_images": len(correct), "test_top1": 100 * correct.count("1") / len(correct)}

    rows = table_2([record("convit", 0, "1110"), record("deit", 0, "1100"), record("convit", 1, "1101"),
                    record("deit", 1, "1100")])
    assert len(rows) == 1 and rows[0]["paired"] and rows[0]["test_images"] == 4
    assert rows[0]["diff"] == pytest.approx(25.0) and rows[0]["seeds"] == 2
    assert rows[0]["comparison"]["pooled"] == (True, True)  # two seeds an arm: the pooled run-to-run SD


def test_the_experiment_command_scores_every_run_on_the_fixed_test_split(tmp_path, capsys):
    from convit_edu.cli import main

    root = jpeg_folder(tmp_path / "data", classes=3, train=44, val=4)
    code = main(["experiment", "sample-efficiency", "--data-root", str(root), "--classes", "2", "--first-class", "1",
                 "--seeds", "0",
                 "--fractions", "1.0", "--images-per-run", "64", "--num-workers", "0", "--progress", "none",
                 "--test-per-class", "8", "--dev-per-class", "4", "--set", "img_size=32", "--model-arg",
                 "embed_dim=36", "--convit-arg", "locality_strength=2.0", "--output", str(tmp_path / "out")])
    assert code == 0, capsys.readouterr().err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert [(r["model"], r["test_images"], len(r["test_correct"]), r["train_images"]) for r in summary] == [
        ("convit", 24, 24, 64), ("deit", 24, 24, 64)]
    run = json.loads((tmp_path / "out" / "convit_f1_s0" / "run.json").read_text())["config"]
    assert (run["img_size"], run["model_args"]["embed_dim"], run["model_args"]["locality_strength"]) == (32, 36, 2.0)
    assert "24" in (tmp_path / "out" / "table.txt").read_text()
    assert sorted(p.name for p in (tmp_path / "out" / "data" / "test").iterdir()) == ["c1", "c2"]  # --first-class 1


def test_table_3_compares_each_ablation_with_every_seed_of_the_convit():
    def record(name, seed, correct):
        model = "deit" if name == "deit" else "convit"
        return {"model": model, "ablation": None if name in ("convit", "deit") else name, "fraction": 0.1,
                "seed": seed, "val_top1": 50.0, "test_correct": correct, "test_images": len(correct),
                "test_top1": 100 * correct.count("1") / len(correct)}

    records = [record("convit", 1, "1111"), record("convit", 2, "0000"), record("convit", 3, "1100"),
               record("frozen_gpsa", 1, "1110"), record("frozen_gpsa", 3, "1000"), record("deit", 1, "1100")]
    rows = {r["name"]: r for r in table_3(records, 0.1)}
    assert rows["convit"]["vs_convit"] is None and rows["convit"]["seeds"] == 3
    frozen = rows["frozen_gpsa"]  # all three ConViT seeds: (3 + 1)/8 - (4 + 0 + 2)/12 of the answers
    assert frozen["vs_convit"] == pytest.approx(0.0) and frozen["vs_convit_se"] > 0
    assert frozen["comparison"]["paired"]["mean"] == pytest.approx(-25.0)  # seeds 1 and 3 alone, beside it
    assert rows["deit"]["vs_convit"] == pytest.approx(50.0 - 100 * 6 / 12)
    assert "+0.0 ±" in format_table_3(list(rows.values()))
    unpaired = table_3([{k: v for k, v in r.items() if k != "test_correct"} for r in records], 0.1)
    assert all(r["vs_convit"] is None for r in unpaired) and "±" not in format_table_3(unpaired)
    ax = plot_table_3(records, 0.1, {"frozen_gpsa": -5.4}).axes[0]  # the compared rows (not the ConViT's own)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["e DeiT", "f frozen GPSA"]
    points = [[round(x, 6) for x in line.get_xdata()] for line in ax.lines]
    assert [0.0, 0.0] in points and [-5.4] in points  # this grid's rows, the paper's frozen GPSA


def test_preconditions_pass_fail_or_wait_for_their_runs():
    def rec(model, f, top1, ablation=None, **more):
        return {"model": model, "fraction": f, "ablation": ablation, "seed": 0, "val_top1": top1, "lr_sum": 0.93,
                "gates_start": [0.73, 0.73], "gates_end": [0.72, 0.71], **more}

    records = [rec("deit", 0.1, 40.0), rec("convit", 0.1, 44.0), rec("convit", 0.1, 39.0, "frozen_gpsa"),
               rec("deit", 1.0, 49.0, val_curve=[[1, 30.0], [2, 40.0], [3, 47.0], [4, 48.0], [5, 49.0]])]
    checks = {c["name"][0:2]: (c["passed"], c["value"]) for c in check_preconditions(records)}
    assert checks["1 "] == (False, 9.0) and checks["2 "] == (True, 5.0)  # 9 points: not scarce enough
    assert checks["3a"] == (False, 0.93) and checks["3b"][0] is False  # gates moved 0.02 at most
    faster_gates = check_preconditions([{**r, "gate_lr_sum": 93.0} for r in records])  # gate_lr_scale 100
    assert (faster_gates[2]["passed"], faster_gates[2]["value"]) == (True, 93.0)  # the gates' own sum is what counts
    assert checks["4 "] == (None, 1.0)  # the DeiT's last quarter gained 1 point, but no ConViT at f = 1 yet
    levelled = rec("convit", 1.0, 45.0, val_curve=[[1, 30.0], [2, 40.0], [3, 44.0], [4, 45.5], [5, 45.0]])
    assert check_preconditions(records + [levelled])[-1]["passed"] is True
    climbing = rec("convit", 1.0, 45.0, val_curve=[[1, 30.0], [2, 35.0], [3, 40.0], [4, 42.0], [5, 45.0]])
    assert check_preconditions(records + [climbing])[-1]["passed"] is False  # the ConViT at f = 1 still climbs
    assert check_preconditions(records[:2])[1]["passed"] is None  # no frozen-GPSA run: not checked
