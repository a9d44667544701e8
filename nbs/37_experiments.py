# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Running the experiments: one command per grid, then tables and figures
#
# Chapter 35 described the grids and chapter 36 turns records into tables. Here `convit-edu experiment
# sample-efficiency|ablations` runs a grid, resuming where it stopped, scores every run on one fixed test set
# image by image, and writes the records, Tables 2 and 3 and the curves of Figs. 5 and 6. A tiny grid goes
# through the real command end to end, in FAST mode and in full.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp experiments
# Run a grid of experiments (resumable), read its logs, and build the paper's Tables 2 and 3 and figures.

# %%
#| export
import json
import math
import warnings
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from matplotlib.figure import Figure
from torch.utils.data import Dataset, Subset

from convit_edu.augment import build_transforms
from convit_edu.benchmarks import measure_model
from convit_edu.files import write_json, write_text
from convit_edu.checks import positive_int
from convit_edu.config import TrainConfig
from convit_edu.datasets import ImageFolderDataset, subsample_per_class
from convit_edu.devices import autocast, resolve_device, resolve_precision
from convit_edu.evaluation import evaluate
from convit_edu.experiment_design import ABLATIONS, RunSpec
from convit_edu.loaders import build_loader
from convit_edu.locality import LocalityRecorder, plot_gate_history, plot_nonlocality_history, read_locality
from convit_edu.models import VisionTransformer
from convit_edu.optimisation import learning_rate_sum
from convit_edu.run_records import RunFolder
from convit_edu.run_state import settings_changed
from convit_edu.tables import format_table_2, format_table_3, plot_table_2, table_2, table_3
from convit_edu.training import train

# %%
# %matplotlib inline
import subprocess
import sys
torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# ## One command for the whole grid
#
# `convit-edu experiment sample-efficiency` (and its sibling `ablations`) runs a grid in this process, one run after
# another, on any ImageNet-style folder. Each run trains with `train` (so `--resume auto` semantics: a run stopped
# half-way continues from its `last.pt`), records σ(λ) and the nonlocality of every layer about 20 times along the way
# (`LocalityRecorder`, for Figs. 5 and 6), then scores the final model on the validation images, on the held-out
# training images, on the training images it saw and on the fixed test images (below), image by image. The record also
# keeps the schedule's learning-rate sum (and the gates', `gate_lr_scale` times it) and the validation curve, for
# chapter 36's pre-conditions. It writes the run's `record.json` last: a folder with a record is finished and is
# skipped the next time, so the command resumes a partly finished grid where it stopped; it refuses a folder of runs
# trained with other settings (`refuse_other_settings`, as `train --resume` does, chapter 26). After every run,
# `OUTPUT/summary.json` (one record per finished run), `OUTPUT/table.txt` and the figures are written again.
#
# Each run is the `TrainConfig` its printed command trains (chapter 35): here it just gets its folder, `--resume auto`.

# %%
#| export
def run_config(spec: RunSpec, folder: str | Path, **overrides: Any) -> TrainConfig:
    """``spec``'s ``TrainConfig`` training into ``folder``, with ``overrides`` (``TrainConfig`` fields) on top."""
    return replace(spec.config, output=str(folder), **overrides)


# %% [markdown]
# A grid's printed command, read back by the `train` command's own parser (chapter 22's `config_from_words`), gives
# exactly its run's config: every flag exists and lands in its field.

# %%
import shlex
from convit_edu.config_words import config_from_words
from convit_edu.experiment_design import train_command

spec = RunSpec("demo", "ConViT", TrainConfig(model="convit_small", model_args={"use_local_init": False},
                                             data_args={"num_train": 64}, classes=10, ema_decay=0.999))
words = shlex.split(train_command(spec, "out"))[4:]  # after `python -m convit_edu.cli train`
assert config_from_words(words) == run_config(spec, "out/demo")
print("read back:", config_from_words(words).model_args, "classes", config_from_words(words).classes)

# %% [markdown]
# ### One test set for every fraction
#
# Scoring each fraction on "the training images it left out" gives each fraction its own test set (and f = 1
# only the validation images): fractions are then compared on different images. `fixed_test_split` builds,
# once, a folder in which that cannot happen. Of each class of the source it sets aside the **last
# `test_per_class` training images plus every validation image** as `test/` (no fraction trains on them), the
# `dev_per_class` training images before those as `val/` (what training logs and pilots are scored on, so a
# design is never chosen on test images), and the rest as `train/`, which the fractions subsample. The files
# are symbolic links; `split.json` records how the folder was made, and a folder made differently is refused.
# `convit-edu experiment` makes it in `OUTPUT/data` by default (`--test-per-class 100 --dev-per-class 50`: of
# Tiny ImageNet's 500 training images per class, 350 to subsample, 50 dev, 100 + 50 validation to test);
# `--test-per-class 0` keeps the first design's scoring. `first_class` (`--first-class`) starts the split's classes
# further down the sorted list, so that a grid can be rerun on other classes of the same folder.

# %%
#| export
def fixed_test_split(source: str | Path, dest: str | Path, classes: int, test_per_class: int = 100,
                     dev_per_class: int = 50, first_class: int = 0) -> Path:
    """Make (or check) ``dest``: ``classes`` classes of the ImageNet-style folder ``source`` from the
    ``first_class``-th in sorted order as ``train/`` (the training images a fraction subsamples), ``val/``
    (``dev_per_class`` training images per class, scored during training) and ``test/`` (the last ``test_per_class``
    training images and every validation image of each class), as symbolic links; returns ``dest``."""
    source, dest = Path(source).resolve(), Path(dest)
    positive_int("classes", classes)
    positive_int("test_per_class", test_per_class)
    positive_int("dev_per_class", dev_per_class, minimum=0)
    positive_int("first_class", first_class, minimum=0)
    recipe = {"source": str(source), "classes": classes, "first_class": first_class, "test_per_class": test_per_class,
              "dev_per_class": dev_per_class}
    if (dest / "split.json").is_file():
        made = {"first_class": 0, **json.loads((dest / "split.json").read_text())}  # older splits began at class 0
        if {k: made.get(k) for k in recipe} != recipe:
            raise ValueError(f"{dest} holds another split ({made}), not {recipe}: choose another folder")
        return dest
    train, val = (ImageFolderDataset(source / split, max_classes=first_class + classes) for split in ("train", "val"))
    by_class: dict[str, dict[int, list[str]]] = {"train": {}, "val": {}}
    for split, ds in (("train", train), ("val", val)):
        for path, target in ds.samples:  # one pass over each listing, in its sorted order
            by_class[split].setdefault(target, []).append(path)
    parts: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    for c in range(first_class, first_class + classes):
        files = by_class["train"].get(c, [])
        if len(files) <= test_per_class + dev_per_class:
            raise ValueError(f"class {train.classes[c]!r} has {len(files)} training images: test_per_class "
                             f"{test_per_class} + dev_per_class {dev_per_class} would leave none to train on")
        cut = len(files) - test_per_class
        parts["train"] += files[:cut - dev_per_class]
        parts["val"] += files[cut - dev_per_class:cut]
        parts["test"] += files[cut:] + by_class["val"].get(c, [])
    for split, files in parts.items():
        for file in files:
            link = dest / split / Path(file).parent.name / Path(file).name
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                link.symlink_to(Path(file).resolve())
    write_json(dest / "split.json", {**recipe, **{f"{k}_images": len(v) for k, v in parts.items()}})
    return dest


# %% [markdown]
# The sets a run is scored on, all with the evaluation transform: the validation split, the training images its fraction
# kept (does it fit them?), the ones the fraction left out and, in a `fixed_test_split` folder, the test images — for
# those, the run keeps which image it got right (`per_image_correct`), so two models can be compared image by image.

# %%
#| export
def scoring_sets(cfg: TrainConfig) -> dict[str, Dataset]:
    """``val``, ``train`` (the images the run trains on) and ``heldout`` (the rest of the first ``cfg.classes``
    classes' training images; empty at f = 1) of an ImageFolder run, with the run's evaluation transform."""
    _, val_tf = build_transforms(cfg.aug_config())
    root = Path(cfg.data_root)
    every = ImageFolderDataset(root / "train", val_tf, max_classes=cfg.classes)
    kept = subsample_per_class(every.targets, cfg.fraction)
    left_out = sorted(set(range(len(every))) - set(kept))
    sets = {"val": ImageFolderDataset(root / "val", val_tf, max_classes=cfg.classes),
            "train": Subset(every, kept), "heldout": Subset(every, left_out)}
    if (root / "test").is_dir():
        sets["test"] = ImageFolderDataset(root / "test", val_tf, max_classes=cfg.classes)
    return sets


def per_image_correct(model: torch.nn.Module, dataset: Dataset, *, batch_size: int = 256,
                      device: str | torch.device = "cpu", precision: str = "fp32", num_workers: int = 0) -> str:
    """Which images of ``dataset`` ``model`` classifies right (top-1), in dataset order, as a string of "0" and "1"."""
    device, precision = torch.device(device), resolve_precision(precision, device)  # "auto": bf16 on a GPU
    loader = build_loader(dataset, batch_size, None, num_workers=num_workers, seed=0, drop_last=False)
    hits, mode = [], model.training
    model.eval()
    with torch.no_grad():
        for images, labels in loader:
            with autocast(device, precision):
                logits = model(images.to(device))
            hits.append(logits.argmax(dim=1).cpu() == labels)
    model.train(mode)
    return "".join("1" if h else "0" for h in torch.cat(hits).tolist())


def _gpsa_layer_means(gates: list) -> list[float]:
    return [sum(heads) / len(heads) for heads in gates]


def train_run(spec: RunSpec, output: str | Path, records: int = 20) -> dict | None:
    """Train ``spec`` into ``output/spec.name`` (resuming its ``last.pt``), score it, write and return its
    ``record.json``; None when a signal stopped it (its checkpoint lets the next call continue)."""
    folder = Path(output) / spec.name
    cfg = run_config(spec, folder, resume="auto")
    sets = scoring_sets(cfg)
    probe = torch.stack([sets["val"][i][0] for i in range(0, len(sets["val"]), max(1, len(sets["val"]) // 16))])
    steps = cfg.epochs * cfg.steps_per_epoch(len(sets["train"]))
    recorder = LocalityRecorder(probe, every=max(1, steps // positive_int("records", records)),
                                path=folder / "locality.json")
    result = train(cfg, callbacks=[recorder])
    if result.stopped:
        return None
    device = next(result.model.parameters()).device
    test = sets.pop("test", None)
    scores = {name: evaluate(result.model, ds, batch_size=256, device=device, precision=cfg.precision,
                             num_workers=cfg.loader_workers())["top1"] if len(ds) else None
              for name, ds in sets.items()}
    correct = None if test is None else per_image_correct(result.model, test, device=device, precision=cfg.precision,
                                                          num_workers=cfg.loader_workers())
    ablation = spec.name.rsplit("_f", 1)[0]
    record = {"name": spec.name, "model": ABLATIONS[ablation].model, "fraction": cfg.fraction, "seed": cfg.seed,
              "ablation": None if ablation in ("convit", "deit") else ablation, "epochs": cfg.epochs,
              "val_top1": scores["val"], "val_images": len(sets["val"]), "train_top1": scores["train"],
              "heldout_top1": scores["heldout"], "heldout_images": len(sets["heldout"]),
              "train_images": len(sets["train"]), "hours": result.history[-1]["time_s"] / 3600,
              "gates_start": _gpsa_layer_means(recorder.records[0]["gates"]),
              "gates_end": _gpsa_layer_means(recorder.records[-1]["gates"])}
    lr_sum = learning_rate_sum(cfg, cfg.steps_per_epoch(len(sets["train"])))
    record.update(lr_sum=lr_sum, gate_lr_sum=lr_sum * cfg.gate_lr_scale,  # the gates' own (chapter 21)
                  val_curve=[[row["epoch"], row["val_top1"]] for row in result.history if "val_top1" in row])
    if correct is not None:
        record.update(test_top1=100 * correct.count("1") / len(correct), test_images=len(correct), test_correct=correct)
    write_json(folder / "record.json", record)
    return record


# %% [markdown]
# Before a grid starts, the command says how long it will take on this machine: the mean measured time of the finished
# runs of each model on this kind of device (a GPU's runs say nothing of a CPU's time), otherwise a training step of
# each model measured on the spot (`throughput.measure_model`) times the run's steps, which leaves out data loading
# and evaluation: a lower bound, and it says so. A run stopped part-way counts for the epochs its `last.pt` has left.
# Each run then starts by printing its budget (`run_budget`): its images and learning-rate sum.

# %%
#| export
def run_budget(cfg: TrainConfig, class_sizes: list[int]) -> tuple[int, float]:
    """The images a run of ``cfg`` trains on (its optimiser steps times the global batch) and the sum of its
    learning rates (about how far AdamW can move one parameter), on classes of ``class_sizes`` training images."""
    steps = cfg.steps_per_epoch(sum(math.floor(cfg.fraction * n + 1e-9) for n in class_sizes))
    return steps * cfg.epochs * cfg.images_per_step(), learning_rate_sum(cfg, steps)


def folder_class_sizes(cfg: TrainConfig) -> list[int]:
    """Training images per class of the run's ``data_root`` (its first ``classes``)."""
    return list(Counter(ImageFolderDataset(Path(cfg.data_root) / "train", max_classes=cfg.classes).targets).values())


def expected_hours(runs: list[RunSpec], output: str | Path) -> tuple[float, str]:
    """Hours the unfinished ``runs`` should take here (one stopped part-way: the epochs its ``last.pt`` has left),
    and how: the finished runs of each model on this device type (their ``run.json`` says), else a step measured now."""
    finished = [RunFolder(p.parent) for p in Path(output).glob("*/record.json")]
    done = [(json.loads((run.path / "record.json").read_text()), run.run_info()["device"])
            for run in finished if run.info.is_file()]
    hours, how = 0.0, set()
    for spec in runs:
        cfg, run = run_config(spec, output), RunFolder(Path(output) / spec.name)
        left = 1 - run.checkpoint()["epoch"] / cfg.epochs if run.holds_run() else 1  # the share still to train
        device, same = resolve_device(cfg.device), spec.name.rsplit("_f", 1)[0] + "_f"  # the same model's runs
        past = [r["hours"] for r, on in done if r["name"].startswith(same) and torch.device(on).type == device.type]
        if past:
            hours += left * sum(past) / len(past)
            how.add(f"finished runs on {device.type}")
            continue
        model = VisionTransformer(cfg.model_config(num_classes=cfg.classes or 10, distilled=False))
        speed = measure_model(model, cfg.images_per_step(), cfg.img_size, steps=2, num_classes=cfg.classes or 10,
                              device=device, precision=cfg.precision)["train_images_per_s"]
        hours += left * run_budget(cfg, folder_class_sizes(cfg))[0] / speed / 3600
        how.add("a training step measured now (data loading and evaluation not included: at least this)")
    return hours, " and ".join(sorted(how)) or "nothing left to run"


def refuse_other_settings(runs: list[RunSpec], output: Path) -> None:
    """ValueError naming each setting (``settings_changed``, the global batch; not ``data_root`` spelt otherwise) that
    differs between a run of ``runs`` now and the run its folder in ``output`` holds (``run.json``)."""
    for run, spec in ((RunFolder(output / s.name), s) for s in runs):
        if not run.info.is_file():
            continue
        folder, info, now = run.path, run.run_info(), run_config(spec, run.path, resume="auto")
        changed = settings_changed(info["config"], now)
        if Path(info["config"]["data_root"]).resolve() == Path(now.data_root).resolve():
            changed.pop("data_root", None)
        if info["global_batch"] != now.images_per_step():
            changed["global batch"] = [info["global_batch"], now.images_per_step()]
        if changed:
            named = "; ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in changed.items())
            raise ValueError(f"{folder} holds a run trained with other settings ({named}): this grid would reuse it; "
                             f"choose another --output or delete {folder}")


def run_grid(runs: list[RunSpec], output: str | Path, records: int = 20) -> list[dict]:
    """Train every unfinished run of ``runs`` into ``output`` one after another (``train_run``), rewriting
    ``summary.json``, ``table.txt`` and the figures after each; the summary's records when all are done. Each run
    first prints its images and learning-rate sum (``run_budget``); runs trained with other settings are refused."""
    output = Path(output)
    refuse_other_settings(runs, output)
    output.mkdir(parents=True, exist_ok=True)
    todo = [s for s in runs if not (output / s.name / "record.json").is_file()]
    hours, how = expected_hours(todo, output)
    print(f"{len(runs) - len(todo)} of {len(runs)} runs already finished in {output}; {len(todo)} to go, "
          f"expected {hours:.1f} h ({60 * hours:.0f} min) on this machine (from {how})", flush=True)
    for i, spec in enumerate(todo, 1):
        cfg = run_config(spec, output)
        images, rates = run_budget(cfg, folder_class_sizes(cfg))
        gates = f", the gates' {rates * cfg.gate_lr_scale:.2f}" if cfg.gate_lr_scale != 1 else ""
        print(f"[{i}/{len(todo)}] {spec.name} ({spec.label}, {cfg.epochs} epochs: {images:,} images, "
              f"learning-rate sum {rates:.2f}{gates})", flush=True)
        if train_run(spec, output, records) is None:
            print(f"stopped during {spec.name}: run the same command again to continue", flush=True)
            break
        write_summary(output)
    return write_summary(output)
# %% [markdown]
# ## From logs to tables
#
# A finished run leaves `run.json` and `log.jsonl`. `collect` reads them back for a list of runs, skipping the ones
# that have not started and saying which ones stopped early, and keeps the numbers the tables and the figures need:
# the top-1/top-5 after the last epoch (what the paper reports), the curves, and the training time.

# %%
#| export
@dataclass(frozen=True)
class RunResult:
    """A run read back from its folder: the spec, the config `convit-edu train` recorded, one log row per epoch."""
    spec: RunSpec
    config: dict
    history: list[dict]

    @property
    def finished(self) -> bool:
        return bool(self.history) and self.history[-1]["epoch"] == self.config["epochs"]

    @property
    def top1(self) -> float:
        """Validation top-1 (%) after the last epoch."""
        return self.history[-1]["val_top1"]

    @property
    def top5(self) -> float:
        return self.history[-1]["val_top5"]


def read_run(folder: str | Path, spec: RunSpec) -> RunResult:
    """The run ``spec`` from ``folder`` (its ``run.json`` and ``log.jsonl``); FileNotFoundError naming the
    missing file, ValueError when the folder holds another run."""
    run = RunFolder(folder)
    config = run.run_info()["config"]
    if (config["model"], config["fraction"]) != (spec.config.model, spec.config.fraction):
        raise ValueError(f"{folder} holds a {config['model']} on fraction {config['fraction']}, not run {spec.name!r} "
                         f"({spec.config.model} on fraction {spec.config.fraction})")
    return RunResult(spec, config, run.history())


def collect(results: str | Path, runs: list[RunSpec]) -> dict[str, RunResult]:
    """Every run of ``runs`` that has logged at least one epoch under ``results``, by name; warns about the
    runs that are missing or unfinished."""
    found, missing, partial = {}, [], []
    for spec in runs:
        try:
            result = read_run(Path(results) / spec.name, spec)
        except FileNotFoundError:
            result = None
        if result is None or not result.history:
            missing.append(spec.name)
            continue
        if not result.finished:
            partial.append(f"{spec.name} ({result.history[-1]['epoch']}/{result.config['epochs']} epochs)")
        found[spec.name] = result
    if missing or partial:
        warnings.warn(f"under {results}: not run {missing}, unfinished {partial}", stacklevel=2)
    return found


# %% [markdown]
# ## The figures, in the paper's style
#
# Table 2 as a picture (test top-1 against f, and the relative gain with its standard error, next to the
# paper's), and Figs. 5 and 6 from the runs' `locality.json`: the nonlocality of every layer over training for
# both models, and σ(λ) of every GPSA head over training.

# %%
#| export
def locality_histories(output: str | Path, fraction: float, seed: int) -> dict[str, list[dict]]:
    """The ``locality.json`` records of the DeiT and the ConViT of one Table 2 cell, by label."""
    return {label: read_locality(Path(output) / f"{name}_f{fraction:g}_s{seed}" / "locality.json")
            for name, label in (("deit", "DeiT"), ("convit", "ConViT"))}


def write_summary(output: str | Path, paper_gaps: dict[float, float] | None = None) -> list[dict]:
    """Gather the finished runs' records into ``output/summary.json`` and write ``table.txt``,
    ``sample_efficiency.png`` and, for the largest fraction both models finished, ``nonlocality.png`` (Fig. 5)
    and ``gates.png`` (Fig. 6); return the records."""
    output = Path(output)
    order = {name: i for i, name in enumerate(ABLATIONS)}
    records = sorted((json.loads(p.read_text()) for p in output.glob("*/record.json")),
                     key=lambda r: (r["fraction"], order[r["ablation"] or r["model"]], r["seed"]))
    write_json(output / "summary.json", records)
    rows = table_2(records)
    text = [format_table_2(rows)] + [format_table_3(table_3(records, f)) for f in sorted({
        r["fraction"] for r in records if r["ablation"] is not None})]
    write_text(output / "table.txt", "\n\n".join(text) + "\n")
    if rows:
        plot_table_2(records, paper_gaps).savefig(output / "sample_efficiency.png")
        histories = locality_histories(output, rows[-1]["fraction"], rows[-1]["paired_seeds"][0])
        plot_nonlocality_history(histories).savefig(output / "nonlocality.png")
        plot_gate_history(histories["ConViT"]).savefig(output / "gates.png")
    return records


# %% [markdown]
# `plot_ablation` draws Table 3's curves (Fig. 12, right) from the runs' logs (`collect`), final top-1 in the legend.

# %%
#| export
def plot_ablation(results: dict[str, RunResult], runs: list[RunSpec]) -> Figure:
    """Top-1 against epochs for each run of ``runs`` (Fig. 12, right), final top-1 in the legend; dashed for a
    model without GPSA layers (the DeiT)."""
    fig = Figure(figsize=(6.5, 3.4), dpi=80)
    ax = fig.subplots()
    for i, spec in enumerate(runs):
        run = results.get(spec.name)
        if run is None:
            continue
        gpsa_layers = spec.config.model_config(num_classes=2, distilled=False).local_up_to_layer
        ax.plot([row["epoch"] for row in run.history], [row["val_top1"] for row in run.history],
                "-" if gpsa_layers else "--", color=f"C{i}", label=f"{spec.label}: {run.top1:.1f}")
    ax.set(xlabel="epoch", ylabel="top-1 (%)", title="ablations (final top-1 in the legend)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


# %% [markdown]
# ## The pipeline end to end, on a tiny grid
#
# Before trusting tables made from records, run the whole chain once through the real command, in a subprocess: a folder
# of 3 classes of generated JPEGs, split once into 96 training, 8 dev and 24 + 8 test images per class, the grid on two
# fractions with a budget of eight optimiser steps per run, its `summary.json` read back and checked against the schema.
# Interrupting the command and running it again would skip the finished runs (`tests/test_experiments.py` checks it);
# the same command with another setting is refused, each changed setting named, before anything trains.

# %%
# NBVAL_IGNORE_OUTPUT
import shutil
import numpy as np
from PIL import Image

tiny_root, tiny_output = Path("runs/37_tiny/folder"), Path("runs/37_tiny/grid")  # nbs/runs/ is not committed
shutil.rmtree(tiny_root.parent, ignore_errors=True)
pixels = np.random.default_rng(0)
for split, count in (("train", 128), ("val", 8)):
    for c in range(3):
        (tiny_root / split / f"class{c}").mkdir(parents=True)
        for i in range(count):
            tone = pixels.integers(0, 60, (64, 64, 3)) + 60 * c  # one brightness per class, some noise
            Image.fromarray(tone.astype(np.uint8)).save(tiny_root / split / f"class{c}" / f"{i}.jpg")
command = [sys.executable, "-m", "convit_edu.cli", "experiment", "sample-efficiency", "--data-root", str(tiny_root),
           "--classes", "3", "--seeds", "0", "--fractions", "0.5", "1", "--images-per-run", "256",
           "--num-workers", "0", "--progress", "none", "--test-per-class", "24", "--dev-per-class", "8",
           "--output", str(tiny_output)]
print(" ".join(command[1:]))
done = subprocess.run(command, capture_output=True, text=True, timeout=600)
print(done.stdout[-1500:], done.stderr[-1500:])
assert done.returncode == 0
refused = subprocess.run(command + ["--set", "lr=0.0123"], capture_output=True, text=True, timeout=600)
print(refused.stderr)
assert refused.returncode == 1 and "-> 0.0123" in refused.stderr and "lr: " in refused.stderr

# %%
tiny = json.loads((tiny_output / "summary.json").read_text())
print("a record's fields:", ", ".join(tiny[0]))  # (its numbers vary with the CPU: the asserts check them)
print([(r["name"], r["heldout_images"], r["test_images"], len(r["gates_end"])) for r in tiny])
SCHEMA = {"model", "ablation", "fraction", "seed", "val_top1", "heldout_top1", "heldout_images", "gates_start",
          "gates_end"}
assert len(tiny) == 4 and all(SCHEMA <= set(r) for r in tiny)
assert {(r["model"], r["fraction"]) for r in tiny} == {(m, f) for m in ("convit", "deit") for f in (0.5, 1.0)}
assert all(r["heldout_images"] == (144 if r["fraction"] == 0.5 else 0) for r in tiny)
assert all(r["test_images"] == len(r["test_correct"]) == 3 * (24 + 8) for r in tiny)  # one test set for all
assert all(len(r["gates_end"]) == (4 if r["model"] == "convit" else 0) for r in tiny)
assert [(row["fraction"], row["paired"]) for row in table_2(tiny)] == [(0.5, True), (1.0, True)]
