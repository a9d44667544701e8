"""The GPU call of nbs/results/gpu/real-width-40 (its run.py), on the CPU: the registered runs' configs, the packing
under its cap, the budget rule from a measured pace and its printout, and the whole call at toy size, two runs in two
processes, probed, trained and collected."""

import importlib.util
import json
import tarfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from convit_edu.optimisation import learning_rate_sum, run_schedule
from convit_edu.training import train

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("real_width_40", ROOT / "nbs/results/gpu/real-width-40/run.py")
rw = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rw)

pytestmark = pytest.mark.usefixtures("one_thread")


def photos(root: Path, classes: int, train: int, val: int, size: int = 20) -> Path:
    """An ImageNet-style folder of JPEGs, one brightness per class, and its classes.txt."""
    pixels = np.random.default_rng(0)
    for split, count in (("train", train), ("val", val)):
        for c in range(classes):
            folder = root / split / f"n{c:02d}"
            folder.mkdir(parents=True)
            for i in range(count):
                tone = pixels.integers(0, 40, (size, size, 3)) + 50 * c
                Image.fromarray(tone.astype(np.uint8)).save(folder / f"n{c:02d}_{i}.JPEG")
    (root / "classes.txt").write_text("".join(f"n{c:02d}\tclass {c}\n" for c in range(classes)))
    return root


def links(root: Path, classes: int, per_class: int) -> Path:
    """A folder of ``classes`` classes of ``per_class`` training links to one JPEG (and one validation link each)."""
    image = photos(root / "one", 1, 1, 0) / "train" / "n00" / "n00_0.JPEG"
    for split, count in (("train", per_class), ("val", 1)):
        for c in range(classes):
            (root / split / f"c{c:02d}").mkdir(parents=True)
            for i in range(count):
                (root / split / f"c{c:02d}" / f"{i:03d}.JPEG").symlink_to(image)
    return root


TOY = rw.Design(classes=2, fraction=0.5, seeds=(1,), test_per_class=4, dev_per_class=2, evaluations=4,
                common={"img_size": 16, "global_batch": 4, "lr": 8e-3, "clip_grad": 1.0, "drop_path_rate": 0.1,
                        "model_args": {"patch_size": 4, "embed_dim": 16, "num_heads": 2, "depth": 2},
                        "aug_args": {"randaugment_magnitude": 9, "erasing": 0.25}, "compile": False,
                        "device": "cpu", "precision": "fp32", "progress": "lines"},
                convit_args={"num_heads": 2, "local_up_to_layer": 1}, seconds=120, window_s=1, start_s=1, end_s=1,
                safety=0.05, min_steps=4, probe_steps=40)  # training then takes about safety × the time left


def test_the_registered_runs_are_the_readmes_four_with_20_evaluations_and_a_10_percent_warm_up(tmp_path):
    specs = rw.run_specs(rw.Design(), links(tmp_path, 40, 40), 5000, 3)
    assert list(specs) == ["deit_f0.1_s1", "convit_f0.1_s1", "deit_f0.1_s2", "convit_f0.1_s2"]
    deit, convit = specs["deit_f0.1_s1"].config, specs["convit_f0.1_s1"].config
    assert deit.model_args == {"patch_size": 4, "embed_dim": 192, "num_heads": 3, "depth": 12}
    assert convit.model_args == {"patch_size": 4, "embed_dim": 192, "num_heads": 4, "depth": 12,
                                 "local_up_to_layer": 10}
    for cfg in (deit, convit):
        assert (cfg.epochs, cfg.epoch_steps, cfg.eval_every) == (20, 250, 1)  # the dev score every 5 % of 5 000
        schedule = run_schedule(cfg, cfg.steps_per_epoch(160), cfg.images_per_step())
        assert (schedule.total_steps, schedule.warmup_steps, schedule.peak_lr) == (5000, 500, pytest.approx(2e-3))
        assert (cfg.img_size, cfg.global_batch, cfg.clip_grad, cfg.drop_path_rate, cfg.weight_decay, cfg.min_lr,
                cfg.fraction, cfg.classes, cfg.compile, cfg.num_workers) == (48, 128, 1.0, 0.1, 0.05, 1e-5, 0.1, 40,
                                                                          True, 3)
        aug = cfg.aug_config()
        assert (aug.randaugment_magnitude, aug.erasing, aug.mixup_alpha, aug.cutmix_alpha, aug.label_smoothing,
                aug.scale) == (9, 0.25, 0.0, 0.0, 0.1, (0.35, 1.0))
    assert [s.config.seed for s in specs.values()] == [1, 1, 2, 2]


def test_the_classes_pack_under_the_cap_and_a_pack_over_it_is_refused(tmp_path):
    source = photos(tmp_path / "source", 3, 5, 2)
    archive = rw.pack(source, tmp_path / "carry", classes=2)
    names = tarfile.open(archive).getnames()
    assert len([n for n in names if n.endswith(".JPEG")]) == 2 * (5 + 2) and not any("n02" in n for n in names)
    assert "tiny-imagenet-100-first40/classes.txt" in names
    root = rw.unpack(tmp_path / "carry", tmp_path / "data")
    assert sorted(p.name for p in (root / "train").iterdir()) == ["n00", "n01"]
    with pytest.raises(ValueError, match=r"2 classes of .* pack to 0\.0 MB, over the cap of 1e-06 MB"):
        rw.pack(source, tmp_path / "small", classes=2, cap_mb=1e-6)
    assert not (tmp_path / "small" / rw.ARCHIVE).exists()


def test_the_budget_rule_turns_a_measured_pace_into_steps(tmp_path):
    rows = [(100.0 + t / 20, t) for t in range(0, 1000, 10)]  # 20 steps a second
    assert rw.pace_rate(rows, 101.0, 140.0) == pytest.approx(20.0)
    with pytest.raises(ValueError, match="fewer than two pace points"):
        rw.pace_rate(rows, 200.0, 210.0)
    design = rw.Design()
    assert rw.steps_for(design, 20.0, 250.0) == 4500  # ⌊0.9 · 20 · 250 / 20⌋ · 20
    assert rw.steps_for(design, 20.0, 251.2) == 4520 and rw.steps_for(design, 20.0, -5.0) == 0
    # a real run's pace: Pace writes it, and stops the run when told
    cfg = replace(rw.run_specs(TOY, photos(tmp_path / "toy", 2, 10, 2), 400, 0)["deit_f0.5_s1"].config,
                  output=str(tmp_path / "run"), progress="none")
    pace = rw.Pace(tmp_path / "pace.txt", tmp_path / "STOP", every=5)
    (tmp_path / "STOP").touch()  # already there: the run stops at the first pace point
    result = train(cfg, callbacks=[pace])
    assert result.stopped == "callback" and [s for _, s in rw.read_pace(tmp_path / "pace.txt")] == [5]
    (tmp_path / "STOP").unlink()
    pace.stop = tmp_path / "never"
    train(replace(cfg, epochs=1, epoch_steps=40, output=str(tmp_path / "again")), callbacks=[pace])
    rows = rw.read_pace(tmp_path / "pace.txt")
    assert [s for _, s in rows] == [5, *range(5, 41, 5)] and rw.pace_rate(rows[1:], 0, time.time()) > 0


def test_the_budget_is_printed_before_the_first_step(tmp_path, capsys):
    spec = rw.run_specs(rw.Design(), links(tmp_path, 40, 40), 5000, 3)["convit_f0.1_s1"]
    rw.announce(spec)
    lr_sum = learning_rate_sum(spec.config, 250)
    assert capsys.readouterr().out == (
        f"budget: 5,000 steps of 128 images a run (640,000 images, 4000 passes over the 160), a warm-up of 500 steps, "
        f"learning-rate sum {lr_sum:.2f}; the dev score every 250 steps\n")
    assert 5.0 < lr_sum < 5.05  # about S × 10⁻³: half the peak of 2 × 10⁻³ a step, over the cosine


def test_the_call_probes_the_runs_side_by_side_trains_them_for_the_budget_and_collects_their_records(tmp_path,
                                                                                                     capsys):
    rw.pack(photos(tmp_path / "source", 2, 16, 2), tmp_path / "carry", classes=2)
    runs, out = tmp_path / "runs", tmp_path / "out"
    out.mkdir()
    assert rw.gpu(out, time.time(), TOY, carry=tmp_path / "carry", data=tmp_path / "data", runs=runs) == 0
    printed = capsys.readouterr().out
    budget = json.loads((runs / "budget.json").read_text())
    steps = budget["steps"]
    assert steps >= TOY.min_steps and steps % TOY.evaluations == 0 and min(budget["rates"].values()) > 0
    assert printed.index("probe: ") < printed.index(f"budget: {steps:,} steps") < printed.index("ConViT - DeiT")
    records = {r["name"]: r for r in json.loads((runs / "summary.json").read_text())}
    assert set(records) == {"deit_f0.5_s1", "convit_f0.5_s1"}
    for name, record in records.items():
        assert len(record["test_correct"]) == 2 * (4 + 2) and len(record["val_curve"]) == TOY.evaluations
        logged = [json.loads(line)["step"] for line in (runs / name / "log.jsonl").read_text().splitlines()]
        assert logged == [steps // 4 * k for k in (1, 2, 3, 4)]  # the dev score every quarter of the steps
    with tarfile.open(out / rw.RESULTS) as tar:
        names = tar.getnames()
    assert {"summary.json", "table.txt", "budget.json", "convit_f0.5_s1/record.json", "deit_f0.5_s1/log.jsonl",
            "probe/pace-convit_f0.5_s1.txt", "convit_f0.5_s1.out"} <= set(names)
    assert not any(n.endswith(".pt") or n.startswith(("data/", "compile-cache")) for n in names)
    # called again, it keeps the budget and trains nothing that is finished
    assert rw.gpu(out, time.time(), TOY, carry=tmp_path / "carry", data=tmp_path / "data", runs=runs) == 0
    assert "0 of 2 runs to train" in capsys.readouterr().out
