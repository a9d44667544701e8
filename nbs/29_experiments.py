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
# Chapter 27 described the grids. Here `convit-edu experiment sample-efficiency|ablations` runs one, resuming
# where it stopped; each run's logs and records become the rows of the paper's Tables 2 and 3 and the curves
# of its Figs. 5 and 6. A tiny grid goes through the real command end to end, in FAST mode and in full.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp experiments
# Run a grid of experiments (resumable), read its logs, and build the paper's Tables 2 and 3 and figures.

# %%
#| export
import math
from collections import Counter
from dataclasses import replace
from typing import Any

import torch
from matplotlib.figure import Figure
from torch.utils.data import Dataset, Subset

from convit_edu.augment import build_transforms
from convit_edu.benchmarks import measure_model
from convit_edu.checkpoints import write_json
from convit_edu.checks import positive_int
from convit_edu.config import TrainConfig
from convit_edu.datasets import ImageFolderDataset, subsample_per_class
from convit_edu.devices import autocast, resolve_device
from convit_edu.evaluation import evaluate
from convit_edu.experiment_design import ABLATIONS, RunSpec
from convit_edu.loaders import build_loader
from convit_edu.locality import LocalityRecorder, plot_gate_history, plot_nonlocality_history, read_locality
from convit_edu.models import VisionTransformer
from convit_edu.training import train

# %%
# %matplotlib inline
import json
import subprocess
import sys
from pathlib import Path

import torch

torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# ## One command for the whole grid
#
# `convit-edu experiment sample-efficiency` (and its sibling `ablations`) runs a grid in this process, one run
# after another, on any ImageNet-style folder. Each run trains with `train` (so `--resume auto` semantics:
# a run stopped half-way continues from its `last.pt`), records σ(λ) and the nonlocality of every layer about
# 20 times along the way (`LocalityRecorder`, for Figs. 5 and 6), then scores the final model on the
# validation images, on the held-out training images and on the training images it saw. It writes the run's
# `record.json` last: a folder with a record is finished and is skipped the next time, so the command
# resumes a partly finished grid where it stopped. After every run, `OUTPUT/summary.json` (one record per
# finished run), `OUTPUT/table.txt` and the figures are written again.
#
# A run of a grid already is a `TrainConfig` (chapter 27): the one its printed command trains. Here it only
# gets its folder, and `--resume auto`.

# %%
#| export
def run_config(spec: RunSpec, folder: str | Path, **overrides: Any) -> TrainConfig:
    """``spec``'s ``TrainConfig`` training into ``folder``, with ``overrides`` (``TrainConfig`` fields) on top."""
    return replace(spec.config, output=str(folder), **overrides)


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

# %%
#| export
def fixed_test_split(source: str | Path, dest: str | Path, classes: int, test_per_class: int = 100,
                     dev_per_class: int = 50) -> Path:
    """Make (or check) ``dest``: the first ``classes`` classes of the ImageNet-style folder ``source`` as
    ``train/`` (the training images a fraction subsamples), ``val/`` (``dev_per_class`` training images per class,
    scored during training) and ``test/`` (the last ``test_per_class`` training images and every validation image
    of each class), as symbolic links; returns ``dest``."""
    source, dest = Path(source).resolve(), Path(dest)
    positive_int("classes", classes)
    positive_int("test_per_class", test_per_class)
    positive_int("dev_per_class", dev_per_class, minimum=0)
    recipe = {"source": str(source), "classes": classes, "test_per_class": test_per_class,
              "dev_per_class": dev_per_class}
    if (dest / "split.json").is_file():
        made = json.loads((dest / "split.json").read_text())
        if {k: made.get(k) for k in recipe} != recipe:
            raise ValueError(f"{dest} holds another split ({made}), not {recipe}: choose another folder")
        return dest
    train, val = (ImageFolderDataset(source / split, max_classes=classes) for split in ("train", "val"))
    parts: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    for c in range(classes):
        files = [p for p, t in train.samples if t == c]
        if len(files) <= test_per_class + dev_per_class:
            raise ValueError(f"class {train.classes[c]!r} has {len(files)} training images: test_per_class "
                             f"{test_per_class} + dev_per_class {dev_per_class} would leave none to train on")
        cut = len(files) - test_per_class
        parts["train"] += files[:cut - dev_per_class]
        parts["val"] += files[cut - dev_per_class:cut]
        parts["test"] += files[cut:] + [p for p, t in val.samples if t == c]
    for split, files in parts.items():
        for file in files:
            link = dest / split / Path(file).parent.name / Path(file).name
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                link.symlink_to(Path(file).resolve())
    write_json(dest / "split.json", {**recipe, **{f"{k}_images": len(v) for k, v in parts.items()}})
    return dest


# %% [markdown]
# The sets a run is scored on, all with the evaluation transform: the validation split, the training images
# its fraction kept (does it fit them?), the ones the fraction left out and, in a `fixed_test_split` folder, the
# test images — for those, the run keeps which image it got right (`per_image_correct`), so two models can be
# compared image by image.

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
    device = torch.device(device)
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
    steps = cfg.epochs * (len(sets["train"]) // (cfg.global_batch or cfg.batch_size))
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
    record = {
        "name": spec.name, "model": ABLATIONS[ablation].model,
        "ablation": None if ablation in ("convit", "deit") else ablation, "fraction": cfg.fraction,
        "seed": cfg.seed, "val_top1": scores["val"], "val_images": len(sets["val"]),
        "heldout_top1": scores["heldout"], "heldout_images": len(sets["heldout"]),
        "train_top1": scores["train"], "train_images": len(sets["train"]), "epochs": cfg.epochs,
        "hours": result.history[-1]["time_s"] / 3600,
        "gates_start": _gpsa_layer_means(recorder.records[0]["gates"]),
        "gates_end": _gpsa_layer_means(recorder.records[-1]["gates"])}
    if correct is not None:
        record.update(test_top1=100 * correct.count("1") / len(correct), test_images=len(correct),
                      test_correct=correct)
    write_json(folder / "record.json", record)
    return record


# %% [markdown]
# Before a grid starts, the command says how long it will take on this machine: the mean measured time of
# the finished runs of each model when there are some, otherwise a training step of each model measured on the
# spot (`throughput.measure_model`) times the run's steps. The measured step leaves out data loading and the
# per-epoch evaluation, so the second kind of estimate is a lower bound, and says so.

# %%
#| export
def expected_hours(runs: list[RunSpec], output: str | Path) -> tuple[float, str]:
    """Hours the unfinished ``runs`` should take here, and how that was estimated."""
    done = [json.loads(p.read_text()) for p in Path(output).glob("*/record.json")]
    hours, how = 0.0, set()
    for spec in runs:
        past = [r["hours"] for r in done if r["name"].startswith(spec.name.rsplit("_f", 1)[0] + "_f")]
        if past:
            hours += sum(past) / len(past)
            how.add("finished runs")
            continue
        cfg = run_config(spec, output)
        batch = cfg.global_batch or cfg.batch_size
        model = VisionTransformer(cfg.model_config(num_classes=cfg.classes or 10, distilled=False))
        speed = measure_model(model, batch, cfg.img_size, steps=2, num_classes=cfg.classes or 10,
                              device=resolve_device(cfg.device), precision=cfg.precision)["train_images_per_s"]
        class_sizes = Counter(ImageFolderDataset(Path(cfg.data_root) / "train", max_classes=cfg.classes).targets)
        images = sum(math.floor(cfg.fraction * n + 1e-9) for n in class_sizes.values()) // batch * batch
        hours += cfg.epochs * images / speed / 3600
        how.add("a training step measured now (data loading and evaluation not included: at least this)")
    return hours, " and ".join(sorted(how)) or "nothing left to run"


def run_grid(runs: list[RunSpec], output: str | Path, records: int = 20) -> list[dict]:
    """Train every unfinished run of ``runs`` into ``output`` one after another (``train_run``), rewriting
    ``summary.json``, ``table.txt`` and the figures after each; the summary's records when all are done."""
    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    todo = [s for s in runs if not (output / s.name / "record.json").is_file()]
    hours, how = expected_hours(todo, output)
    print(f"{len(runs) - len(todo)} of {len(runs)} runs already finished in {output}; {len(todo)} to go, "
          f"expected {hours:.1f} h on this machine (from {how})", flush=True)
    for i, spec in enumerate(todo, 1):
        print(f"[{i}/{len(todo)}] {spec.name} ({spec.label}, {spec.config.epochs} epochs)", flush=True)
        if train_run(spec, output, records) is None:
            print(f"stopped during {spec.name}: run the same command again to continue", flush=True)
            break
        write_summary(output)
    return write_summary(output)
# %% [markdown]
# ## From logs to tables
#
# A finished run leaves `run.json` and `log.jsonl`. `collect` reads them back for a list of runs, skipping the
# ones that have not started and saying which ones stopped early, and keeps the numbers the tables and the
# figures need: the top-1/top-5 at the end of training (the paper reports the accuracy after the last epoch),
# the curves, and the training time.

# %%
#| export
import json
import warnings
from dataclasses import dataclass
from pathlib import Path


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
    folder = Path(folder)
    for name in ("run.json", "log.jsonl"):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder / name} does not exist: run {spec.name!r} has not written it yet")
    config = json.loads((folder / "run.json").read_text())["config"]
    if (config["model"], config["fraction"]) != (spec.config.model, spec.config.fraction):
        raise ValueError(f"{folder} holds a {config['model']} on fraction {config['fraction']}, not run {spec.name!r} "
                         f"({spec.config.model} on fraction {spec.config.fraction})")
    history = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines() if line.strip()]
    return RunResult(spec, config, history)


def collect(results: str | Path, runs: list[RunSpec]) -> dict[str, RunResult]:
    """Every run of ``runs`` that has logged at least one epoch under ``results``, by name; warns about the
    runs that are missing or unfinished."""
    found, missing, partial = {}, [], []
    for spec in runs:
        try:
            result = read_run(Path(results) / spec.name, spec)
        except FileNotFoundError:
            missing.append(spec.name)
            continue
        if not result.history:
            missing.append(spec.name)
            continue
        if not result.finished:
            partial.append(f"{spec.name} ({result.history[-1]['epoch']}/{result.config['epochs']} epochs)")
        found[spec.name] = result
    if missing or partial:
        warnings.warn(f"under {results}: not run {missing}, unfinished {partial}", stacklevel=2)
    return found


def relative_gain(convit: float, deit: float) -> float:
    """The paper's "Gap" (Table 2): (ConViT − DeiT) / DeiT, in %."""
    if deit <= 0:
        raise ValueError(f"the DeiT accuracy {deit} must be > 0 to compute a relative gain")
    return 100 * (convit - deit) / deit


# %% [markdown]
# ## From records to tables
#
# `summary.json` is the list of the finished runs' records. Table 2 pairs the ConViT and the DeiT of each seed
# and fraction. In a `fixed_test_split` folder both are scored on the same test images at every fraction, and
# the uncertainty is **paired** (`paired_bootstrap`): it redraws the seeds and the test images with
# replacement, the same images for both models, so an image both get right or both get wrong adds no noise to
# their difference. The first design (chapter 29) had no such split: there the score is on every image neither
# run trained on (`unseen_top1`, different images at different fractions) and the standard error adds the
# seed-to-seed spread and the binomial noise of each model's score, as if the two were scored independently.

# %%
#| export
def unseen_top1(record: dict) -> float:
    """Top-1 (%) on every image the run did not train on: its validation and held-out training images."""
    n_val, n_out = record["val_images"], record["heldout_images"]
    return (record["val_top1"] * n_val + (record["heldout_top1"] or 0.0) * n_out) / (n_val + n_out)


def test_top1(record: dict) -> float:
    """Top-1 (%) on the run's test images: the fixed test split's (``fixed_test_split``) when it was scored on
    one, else every image it did not train on (``unseen_top1``)."""
    return record["test_top1"] if "test_top1" in record else unseen_top1(record)


def _images(record: dict) -> int:
    return record["val_images"] + record["heldout_images"]


def _mean_se(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, float("nan")
    return mean, (sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values)) ** 0.5


def paired_bootstrap(convit: list[str], deit: list[str], resamples: int = 2000, seed: int = 0) -> dict[str, float]:
    """ConViT and DeiT test top-1, their difference (points) and the relative gain (%) from per-image correctness
    strings of the same test images (``per_image_correct``), one ConViT and one DeiT per seed; standard errors from
    a bootstrap that draws seeds and images with replacement, the same images for both models."""
    if not convit or len(convit) != len(deit) or len({len(r) for r in (*convit, *deit)}) != 1:
        raise ValueError(f"need as many ConViT as DeiT runs ({len(convit)} vs {len(deit)}), all scored on the same "
                         f"test images (lengths {sorted({len(r) for r in (*convit, *deit)})})")
    c, d = (torch.tensor([[ch == "1" for ch in run] for run in runs], dtype=torch.float64) for runs in (convit, deit))
    g = torch.Generator().manual_seed(seed)

    def weights(n: int) -> torch.Tensor:  # (resamples, n): how often each of n items is drawn, over n
        draws = torch.randint(n, (resamples, n), generator=g)
        return torch.zeros(resamples, n, dtype=torch.float64).scatter_add_(1, draws, torch.ones_like(draws, dtype=torch.float64)) / n

    images, seeds = weights(c.shape[1]), weights(c.shape[0])
    boot_c, boot_d = (100 * ((images @ runs.T) * seeds).sum(dim=1) for runs in (c, d))
    top_c, top_d = 100 * c.mean().item(), 100 * d.mean().item()
    return {"convit_top1": top_c, "deit_top1": top_d, "diff": top_c - top_d, "diff_se": (boot_c - boot_d).std().item(),
            "gain": relative_gain(top_c, top_d), "gain_se": (100 * (boot_c - boot_d) / boot_d).std().item()}


def _seed_and_binomial(pairs: list[tuple[dict, dict]]) -> dict[str, float]:
    """The first design's uncertainty (unpaired): top-1 on each run's unseen images, seed-to-seed spread and
    binomial noise combined."""
    accs = [(unseen_top1(c), unseen_top1(d)) for c, d in pairs]
    binomial = sum(p * (100 - p) / _images(r) for (c, d), pair in zip(accs, pairs)
                   for p, r in zip((c, d), pair)) ** 0.5 / len(pairs)  # in points
    diff, diff_se = _mean_se([c - d for c, d in accs])
    gain, gain_se = _mean_se([relative_gain(c, d) for c, d in accs])
    deit = sum(d for _, d in accs) / len(accs)
    return {"convit_top1": sum(c for c, _ in accs) / len(accs), "deit_top1": deit, "diff": diff,
            "diff_se": math.hypot(0.0 if math.isnan(diff_se) else diff_se, binomial), "gain": gain,
            "gain_se": math.hypot(0.0 if math.isnan(gain_se) else gain_se, 100 * binomial / deit)}


def table_2(records: list[dict]) -> list[dict]:
    """One row per fraction with a ConViT and a DeiT of the same seed: mean test top-1 of both, the point
    difference and the relative gain (%), with standard errors: paired over the fixed test images
    (``paired_bootstrap``) when every run saved its per-image correctness, else ``_seed_and_binomial``."""
    plain = {(r["model"], r["fraction"], r["seed"]): r for r in records if r["ablation"] is None}
    rows = []
    for f in sorted({key[1] for key in plain}):
        pairs = [(plain[("convit", f, s)], plain[("deit", f, s)]) for s in sorted({k[2] for k in plain})
                 if ("convit", f, s) in plain and ("deit", f, s) in plain]
        if not pairs:
            continue
        paired = all("test_correct" in r for pair in pairs for r in pair)
        stats = (paired_bootstrap([c["test_correct"] for c, _ in pairs], [d["test_correct"] for _, d in pairs])
                 if paired else _seed_and_binomial(pairs))
        rows.append({"fraction": f, "seeds": len(pairs), "paired_seeds": [c["seed"] for c, _ in pairs],
                     "paired": paired, "test_images": pairs[0][0]["test_images"] if paired else _images(pairs[0][0]),
                     **stats, "train_top1": {m: sum(p[i]["train_top1"] for p in pairs) / len(pairs)
                                            for i, m in enumerate(("convit", "deit"))}})
    return rows


def format_table_2(rows: list[dict]) -> str:
    """Table 2's layout with the standard errors: f | DeiT, ConViT (test top-1) | difference | relative gap."""
    lines = [f"{'f':>6} {'seeds':>5} {'images':>6} | {'DeiT':>6} {'ConViT':>6} | {'ConViT - DeiT':>14} | "
             f"{'gap (relative)':>15}"]
    for r in rows:
        lines.append(f"{r['fraction']:>6.0%} {r['seeds']:>5} {r['test_images']:>6} | {r['deit_top1']:>6.1f} "
                     f"{r['convit_top1']:>6.1f} | {r['diff']:>+6.1f} ± {r['diff_se']:<4.1f}pt | "
                     f"{r['gain']:>+6.0f} ± {r['gain_se']:<3.0f}%")
    return "\n".join(lines)


def table_3(records: list[dict], fraction: float) -> list[dict]:
    """The ablations on ``fraction`` in ``ABLATIONS`` order: name, Table 3 row, seeds, mean test and val top-1."""
    rows = []
    for name, a in ABLATIONS.items():
        runs = [r for r in records if r["fraction"] == fraction and r["model"] == a.model
                and r["ablation"] == (None if name in ("convit", "deit") else name)]
        if runs:
            rows.append({"name": name, "table_ref": a.table_ref, "label": a.label, "seeds": len(runs),
                         "test_top1": sum(map(test_top1, runs)) / len(runs),
                         "val_top1": sum(r["val_top1"] for r in runs) / len(runs)})
    return rows


def format_table_3(rows: list[dict]) -> str:
    lines = [f"{'row':<7}{'run':<27}{'seeds':>5}{'test top-1':>11}{'val top-1':>10}"]
    lines += [f"{r['table_ref']:<7}{r['label']:<27}{r['seeds']:>5}{r['test_top1']:>11.1f}{r['val_top1']:>10.1f}"
              for r in rows]
    return "\n".join(lines)
# %% [markdown]
# ## The figures, in the paper's style
#
# Table 2 as a picture (test top-1 against f, and the relative gain with its standard error, next to the
# paper's), and Figs. 5 and 6 from the runs' `locality.json`: the nonlocality of every layer over training for
# both models, and σ(λ) of every GPSA head over training.

# %%
#| export
def plot_table_2(records: list[dict], paper_gaps: dict[float, float] | None = None) -> Figure:
    """Left: test top-1 against f (each seed a dot, the mean a line). Right: the relative gain of the ConViT with
    its standard error, and the paper's (``paper_gaps``) for reference."""
    fig = Figure(figsize=(9, 3.2), dpi=80)
    acc, gains = fig.subplots(1, 2)
    for model, colour, label in (("deit", "C0", "DeiT"), ("convit", "C3", "ConViT")):
        runs = [r for r in records if r["ablation"] is None and r["model"] == model]
        fractions = sorted({r["fraction"] for r in runs})
        acc.plot([r["fraction"] for r in runs], [test_top1(r) for r in runs], ".", color=colour, alpha=0.5)
        acc.plot(fractions, [sum(test_top1(r) for r in runs if r["fraction"] == f) /
                             sum(r["fraction"] == f for r in runs) for f in fractions], "-", color=colour, label=label)
    rows = table_2(records)
    gains.errorbar([r["fraction"] for r in rows], [r["gain"] for r in rows], yerr=[2 * r["gain_se"] for r in rows],
                   fmt="o-", color="C3", capsize=3, label="this grid (± 2 SE)")
    if paper_gaps:
        gains.plot(list(paper_gaps), list(paper_gaps.values()), "s:", color="grey", label="paper (ImageNet, S)")
    gains.axhline(0, color="black", linewidth=0.5)
    for ax in (acc, gains):
        ax.set_xscale("log")
        ax.set_xlabel("fraction of the training images f")
        ax.legend(fontsize=7)
    acc.set(ylabel="test top-1 (%)", title="top-1 on unseen images")
    gains.set(ylabel="relative improvement (%)", title="ConViT over DeiT")
    fig.tight_layout()
    return fig


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
    (output / "table.txt").write_text("\n\n".join(text) + "\n")
    if rows:
        plot_table_2(records, paper_gaps).savefig(output / "sample_efficiency.png")
        histories = locality_histories(output, rows[-1]["fraction"], rows[-1]["paired_seeds"][0])
        plot_nonlocality_history(histories).savefig(output / "nonlocality.png")
        plot_gate_history(histories["ConViT"]).savefig(output / "gates.png")
    return records


# %% [markdown]
# `plot_ablation` draws the curves of Table 3's runs over training (Fig. 12, right) from their logs
# (`collect`), with the final validation top-1 in the legend.

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
# Before trusting tables made from records, run the whole chain once through the real command, in a
# subprocess: a folder of 3 classes of generated JPEGs, split once into 96 training, 8 dev and 24 + 8 test
# images per class, the grid on two fractions with a budget of eight optimiser steps per run, its
# `summary.json` read back and checked against the schema. Interrupting the
# command and running it again would skip the finished runs; the tests check that (`tests/test_experiments.py`).

# %%
# NBVAL_IGNORE_OUTPUT
import shutil

import numpy as np
from PIL import Image

tiny_root, tiny_output = Path("runs/28_tiny_folder"), Path("runs/28_tiny_grid")  # nbs/runs/ is not committed
shutil.rmtree(tiny_root, ignore_errors=True)
shutil.rmtree(tiny_output, ignore_errors=True)
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
