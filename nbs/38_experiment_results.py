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
# # The paper's experiments in miniature: the results
#
# The grid that chapter 35 designed, run with chapter 37's command on this course's CPU: Table 2 (the ConViT's
# gain against the fraction of data), its pre-conditions checked on the runs, Figs. 5 and 6 from the same runs,
# and Table 3's ablations, each beside the paper's numbers, with standard errors, and what they do and do not
# support.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
# %matplotlib inline
import json
import math
from pathlib import Path

import torch

from convit_edu.config import TrainConfig
from convit_edu.experiment_design import ABLATIONS, sample_efficiency_grid, sample_efficiency_scale
from convit_edu.optimisation import learning_rate_sum
from convit_edu.experiments import locality_histories, run_config
from convit_edu.tables import format_table_2, plot_table_2, relative_gain, table_2, table_3, unseen_top1
from convit_edu.locality import plot_gate_history, plot_nonlocality_history, read_locality
from convit_edu.optimisation import scaled_lr

torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# The grid of chapter 35 at the scale of this CPU (10 classes of Tiny ImageNet, their known sizes: the records
# are read whether or not the images are here), and the committed records it produced:

# %%
RESULTS = Path("results/sample-efficiency")  # nbs/results/sample-efficiency: the committed records
CPU = sample_efficiency_scale(Path("../data/tiny-imagenet-100"), classes=10, class_sizes=(500,) * 10)
FRACTIONS, SEEDS, ABLATION_FRACTION = [0.1, 0.3, 1.0], [0, 1], 0.1
cpu_runs = sample_efficiency_grid(CPU, FRACTIONS, SEEDS)
batch = CPU.base.global_batch
steps = {f: CPU.schedule(f)["epochs"] * (sum(math.floor(f * n + 1e-9) for n in CPU.class_sizes) // batch)
         for f in FRACTIONS}
print(f"{len(cpu_runs)} Table 2 runs of {steps[0.1]} steps, batch {batch}")

# %% [markdown]
# Pre-condition (3), checked before any run: the learning rates of a run's schedule sum to enough for the gates
# to move.

# %%
cfg = run_config(cpu_runs[0], "unused")
lr_sum = learning_rate_sum(cfg, steps[cfg.fraction] // cfg.epochs)
print(f"peak learning rate {scaled_lr(cfg.lr, cfg.global_batch):.1e} at batch {cfg.global_batch}; the "
      f"{steps[cfg.fraction]} steps' learning rates sum to "
      f"{lr_sum:.2f}: σ(λ) can move from {torch.sigmoid(torch.tensor(1.0)):.2f} to "
      f"{torch.sigmoid(torch.tensor(1.0 - lr_sum)):.2f} (pre-condition 3)")
assert lr_sum >= 1.5

# %% [markdown]
# ## Table 2 in miniature: the results
#
# The models are chapter 35's: width 72, 9 heads of **8** channels (the paper's ConViT-Ti has 48), depth 6, built
# from the zoo's `convit_tiny` and `deit_tiny` but much smaller — read every gap below as one of these models,
# whose narrow heads give content attention little capacity. The committed records of the grid
# (`nbs/results/sample-efficiency/summary.json`), run as two
# `convit-edu experiment sample-efficiency` commands side by side (`--seeds 0` and `--seeds 1`, one thread each),
# then two `convit-edu experiment ablations` commands (seed 0, three ablations each), on the AMD EPYC (Zen 3,
# AVX2, 2 cores) this course was first developed on. The paper's numbers quoted below are its Table 2 and Table
# 3; at f = 10 % the paper's text gives ConViT 59.5 vs DeiT 46.5 where Table 2 prints 59.6 vs 48.0, and Table 3's
# 59.7 vs 47.8 are the S+ models of its ablation, so each comparison names the table it uses.

# %%
PAPER_TABLE_2_TOP1 = {0.05: (34.8, 47.8), 0.1: (48.0, 59.6), 0.3: (66.1, 73.7), 0.5: (74.6, 78.2), 1.0: (79.9, 81.4)}
PAPER_GAPS = {f: relative_gain(c, d) for f, (d, c) in PAPER_TABLE_2_TOP1.items()}
records = json.loads((RESULTS / "summary.json").read_text())
table_runs = [r for r in records if r["ablation"] is None]
print(f"{len(table_runs)} of {len(cpu_runs)} Table 2 runs finished:", ", ".join(r["name"] for r in table_runs))
rows = table_2(records)
print("\nthis CPU: 10 Tiny ImageNet classes, 64 px, width 72 / 9 heads / depth 6, same steps at every f;")
print("top-1 on every image a run did not train on (validation + held-out training images)")
print(format_table_2(rows))
print("\nthe paper: ImageNet-1k, DeiT-S / ConViT-S, 300 epochs x 1/f, top-1 on ImageNet val")
for f, (deit_top1, convit_top1) in PAPER_TABLE_2_TOP1.items():
    print(f"{f:>6.0%} | {deit_top1:>6.1f} {convit_top1:>6.1f} | gap {PAPER_GAPS[f]:+.0f} %")

# %%
plot_table_2(records, PAPER_GAPS)

# %% [markdown]
# ### The pre-conditions
#
# Checked on the runs, as promised before the results. **(1)** data is scarce at f = 0.1: the DeiT on 10 % of
# the images is at least 10 points below the DeiT on all of them. **(2)** the models fit what they train on:
# training top-1 (evaluation transform) near 100 % at f = 0.1, far above the top-1 on images they did not
# train on.

# %%
def cell_runs(model: str, fraction: float) -> list[dict]:
    return [r for r in table_runs if r["model"] == model and r["fraction"] == fraction]


scarce = {f: sum(map(unseen_top1, cell_runs("deit", f))) / len(cell_runs("deit", f)) for f in (0.1, 1.0)}
print(f"(1) the DeiT on 10 % of the images: {scarce[0.1]:.1f} %, on all of them: {scarce[1.0]:.1f} % "
      f"({scarce[1.0] - scarce[0.1]:.1f} points apart)")
assert scarce[1.0] - scarce[0.1] >= 10
for r in cell_runs("deit", 0.1) + cell_runs("convit", 0.1):
    print(f"(2) {r['name']:<16} trains at {r['train_top1']:5.1f} % on its {r['train_images']} images, "
          f"{unseen_top1(r):5.1f} % on {r['val_images'] + r['heldout_images']} unseen ones")
    assert r["train_top1"] >= 95 and r["train_top1"] - unseen_top1(r) >= 30

# %% [markdown]
# ### Figs. 5 and 6 from these runs
#
# Every run recorded, about 20 times along its training, the nonlocality of each layer (Eq. 8, mean attention
# distance in patches, averaged over heads, on 16 fixed validation images) and σ(λ) of every GPSA head. For the
# runs on 10 % of the data, first seed: the DeiT and the ConViT side by side (Fig. 5), then the gates (Fig. 6).
# Chapter 34 draws the same two figures for the runs on all the data and analyses those models further.

# %%
histories = locality_histories(RESULTS, 0.1, 0)
plot_nonlocality_history(histories)

# %%
plot_gate_history(histories["ConViT"])

# %% [markdown]
# ## Table 3 in miniature: the ablations
#
# The ConViT taken apart on 10 % of the data, one seed (seed 0; rows a and e are Table 2's runs), with the
# same design and budget: (b) the gates frozen at λ = 0 (σ = ½), (c) no convolutional initialization,
# (d) both, (f) the GPSA layers frozen at their initialization (so they stay a fixed local mixing), (g) frozen
# without the convolutional initialization (fixed *random* attention), and App. A's PSA (Eq. 4: content and
# position in one softmax, no gate). One seed has no seed-to-seed error bar of its own; Table 2's two seeds at
# f = 0.1 give one (pooled over the two models, so a rough estimate from 2 degrees of freedom), and the
# difference of two one-seed runs carries √2 times it.

# %%
PAPER_TABLE_3_TOP1 = {  # Table 3 (ConViT-S+, ImageNet, 300 epochs): top-1 on all the data and on 10 % of it
    "convit": (82.2, 59.7), "frozen_gate": (82.0, 57.4), "no_conv_init": (81.4, 56.9),
    "frozen_gate_no_conv_init": (81.6, 54.6), "deit": (79.1, 47.8), "frozen_gpsa": (78.6, 54.3),
    "frozen_gpsa_no_conv_init": (73.7, 44.8)}
seed_var = []
for model in ("convit", "deit"):
    runs = cell_runs(model, ABLATION_FRACTION)
    mean = sum(map(unseen_top1, runs)) / len(runs)
    seed_var.append(sum((unseen_top1(r) - mean) ** 2 for r in runs) / (len(runs) - 1))
seed_sd = math.sqrt(sum(seed_var) / len(seed_var))
ablation_se = math.sqrt(2) * seed_sd  # of the difference between two one-seed runs
rows_3 = table_3([r for r in records if r["seed"] == 0], ABLATION_FRACTION)
ours = {r["name"]: r["test_top1"] for r in rows_3}
print(f"{len(rows_3)} of {len(ABLATIONS)} runs finished; f = {ABLATION_FRACTION:.0%}, seed 0, top-1 on the "
      f"5 000 unseen images.\nOne seed's noise: {seed_sd:.1f} points, so {ablation_se:.1f} for a difference.\n")
print(f"{'row':<7}{'run':<27}{'top-1':>6}{'vs (a)':>8} | {'paper 10 %':>10}{'vs (a)':>8}")
for r in rows_3:
    paper = PAPER_TABLE_3_TOP1.get(r["name"], (None, None))[1]
    paper_text = f"{paper:>10.1f}{paper - PAPER_TABLE_3_TOP1['convit'][1]:>+8.1f}" if paper else f"{'-':>10}"
    print(f"{r['table_ref']:<7}{r['label']:<27}{r['test_top1']:>6.1f}{r['test_top1'] - ours['convit']:>+8.1f} | "
          + paper_text)
ablation_gates = {r["ablation"] or r["model"]: r["gates_end"] for r in records if r["seed"] == 0
                  and r["fraction"] == ABLATION_FRACTION and r["gates_end"]}
print()
for name, g in ablation_gates.items():
    print(f"{name:<27} mean σ(λ) per GPSA layer at the end: {' '.join(f'{v:.3f}' for v in g)}")

# %% [markdown]
# ### The first version of the design, and why it changed
#
# The grid was first run at batch 128: 936 steps per run. Its f = 0.1 cells finished before the gates were
# looked at — and the gates had not moved: every GPSA layer of both seeds ended within 0.02 of σ(1) = 0.73,
# because that schedule's learning rates summed to 0.47. Pre-condition (3) did not exist yet; it was added, and
# the batch changed to 32 (same images, four times the steps, learning-rate sum 1.89). Those runs stay in
# `nbs/results/sample-efficiency-b128/`, read here:

# %%
first = json.loads(Path("results/sample-efficiency-b128/summary.json").read_text())
print(format_table_2(table_2(first)))
first_cfg = TrainConfig.from_dict(json.loads(Path("results/sample-efficiency-b128/convit_f0.1_s0/run.json").read_text())[
    "config"])
first_sum = learning_rate_sum(first_cfg, steps_per_epoch=500 // first_cfg.global_batch)
print(f"batch {first_cfg.global_batch}, {first_cfg.epochs} epochs of {500 // first_cfg.global_batch} steps: "
      f"learning rates sum to {first_sum:.2f}")
moved = max(abs(g - torch.sigmoid(torch.tensor(1.0)).item()) for r in first for g in r["gates_end"])
print(f"largest change of a layer's mean σ(λ) over those runs: {moved:.3f}")
assert first_sum < 1.5 and moved < 0.03

# %% [markdown]
# Did the smaller batch cost speed? The training logs of both grids record images/s per epoch. Both ran as two
# single-threaded runs side by side on the same 2-core AMD EPYC, with other work sharing the cores at times,
# so this is a sanity check rather than a benchmark: the median over each f = 0.1 run's epochs.

# %%
import statistics


def median_speed(folder: Path) -> float:
    rows = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines()]
    return statistics.median(row["images_per_s"] for row in rows)


speed = {batch: [median_speed(root / name) for name in ("convit_f0.1_s0", "convit_f0.1_s1", "deit_f0.1_s0",
                                                         "deit_f0.1_s1")]
         for batch, root in ((128, Path("results/sample-efficiency-b128")), (32, RESULTS))}
for batch, values in speed.items():
    print(f"batch {batch:>3}: median images/s of the f = 0.1 runs (ConViT s0, s1, DeiT s0, s1): "
          + " ".join(f"{v:.0f}" for v in values))
assert min(speed[32]) >= 0.9 * max(speed[128])  # no slower per image at batch 32

# %% [markdown]
# ## What the runs say
#
# The whole grid ran: 12 Table 2 runs (3 fractions × 2 models × 2 seeds) and 6 more for Table 3 and App. A,
# 18 runs of about 3 750 steps (3 744 at f = 1, 3 750 at f = 0.1), 16 to 33 minutes each (the longest while other work shared the cores), two at a time.
# What the numbers above support, each with its uncertainty:
#
# * **The ConViT is ahead where data is scarce, by about a point — within noise.** On the images neither model
#   trained on, ConViT − DeiT is +1.4 ± 0.8 points at f = 0.1 (+3 ± 2 % relative), +0.7 ± 0.8 at f = 0.3
#   (+1 ± 1 %) and −0.6 ± 2.3 at f = 1 (−1 ± 4 %, on the 500 validation images only). All four seed pairs at
#   f ≤ 0.3 favour the ConViT, one of two at f = 1; and the gain shrinks as f grows, the ordering of the
#   paper's Table 2. But no cell is beyond two standard errors, and neither is the fall of the gain from f = 0.1
#   to f = 1. The paper's gaps are +24 %, +12 % and +2 % (its Table 2's column; 11.5 % recomputed from its top-1s,
#   the "+11 %" printed above): the direction is reproduced, the size is not, and the
#   direction itself is not established at this budget. (The validation split alone, 500 images, could not
#   tell the models apart at all at f = 0.1: the held-out training images are what makes the comparison
#   possible.)
# * **The pre-conditions hold**: the DeiT loses 16 points from f = 1 to f = 0.1, and both models fit their
#   training images at f = 0.1 (98.6–100 %). The data-starved regime is there; the prior helps in it only a
#   little here.
# * **The gates moved, a little, in the paper's direction — and more the scarcer the data.** Every GPSA
#   layer's mean σ(λ) went down, toward content, and in both seeds the mean fall is largest at f = 0.1 (0.04),
#   then f = 0.3 (0.03), then f = 1 (0.01–0.02): the same steps over fewer images pull the heads off their
#   positional start faster. At f = 0.1 the last GPSA layer ends below the first in both seeds, as in Fig. 6.
#   Against the paper (late layers to σ ≈ 0) this is barely a start: a layer's mean λ moved by 0.3 at most,
#   where the schedule allowed 1.9 (pre-condition 3): the gradient on λ is small, not the room to move.
# * **Attention hardly localised.** Every layer of every DeiT run ends within 0.2 patch of uniform attention
#   (4.14 on the 8 × 8 grid); the ConViT's GPSA layers widen from 1.98 to 2.2–2.4 patches at f = 0.1, the later layers
#   more (Fig. 5; chapter 34 shows the same, smaller, at f = 1).
# * **Table 3: every row within about two standard errors of the ConViT (a).** The one-seed noise of a
#   difference is 0.9 points; the rows range from +0.3 (b, frozen gate; App. A's PSA) to −1.7 (e, the DeiT, at
#   2.0 standard errors, the edge). One pattern, seen after the fact rather than tested: the three lowest rows
#   are the three whose first four layers have no *trainable* positional attention — (e) the DeiT, (f) and
#   (g) the frozen GPSA layers — 47.1–47.6 % against 48.1–49.2 % for the five others; the paper's three lowest
#   rows at 10 % are the same three. Freezing the gates at σ = ½ (b) cost nothing here, where the paper lost
#   2.3 points: our learned gates barely left their start anyway. Freezing four of six attention layers at
#   *random* (g) cost 1.5 points: at this budget the model's accuracy depends little on what its attention
#   does.
#
# **Diagnosis, and what a larger budget would need.** The effect the paper measures lives in what training
# does to attention: DeiT layers that become local, GPSA gates that fall to 0 in the late layers. Here neither
# happened to more than a few percent of its range, and the ablations say the same: at 3 744 steps of 32
# images on 64 tokens, attention is a small part of what these models learn. Two things would change that.
# A longer schedule: the paper's learning rates sum to about 190, ours to 1.9, and the gates used less than a
# sixth of even that; runs 10–30 times longer (1–4 million images each, 4–12 hours per run on this CPU, minutes on a
# GPU) are the next step, with the same command and `--images-per-run`. And more precision: differences of
# about a point need standard errors under half a point — more seeds (the seed-to-seed part) and more unseen
# images per class (the binomial part), or a paired per-image comparison declared before the runs. The
# command reruns the grid as it is on any ImageNet-style folder; these are the knobs to turn.
# Chapter 39 turns them: pilots, each changing one, look for a regime where the prior can matter.

# %%
by_name = {r["name"]: r for r in records}
minutes = sorted(60 * r["hours"] for r in records)
print(f"{len(records)} runs, {minutes[0]:.0f} to {minutes[-1]:.0f} minutes each")
assert len(records) == 18 and 15 < minutes[0] and minutes[-1] < 35
for f in FRACTIONS:
    (row,) = [r for r in rows if r["fraction"] == f]
    per_seed = [unseen_top1(by_name[f"convit_f{f:g}_s{s}"]) - unseen_top1(by_name[f"deit_f{f:g}_s{s}"])
                for s in SEEDS]
    print(f"f = {f:.0%}: ConViT - DeiT per seed {[round(d, 2) for d in per_seed]}, "
          f"mean {row['diff']:+.1f} ± {row['diff_se']:.1f} ({row['diff'] / row['diff_se']:.1f} SE)")
    assert abs(row["diff"]) < 2 * row["diff_se"]  # within noise, at every fraction
    if f < 1:
        assert all(d > 0 for d in per_seed)  # but every seed pair favours the ConViT where data is scarce
gain = {r["fraction"]: r for r in rows}
assert gain[0.1]["gain"] > gain[0.3]["gain"] > gain[1.0]["gain"]  # the paper's ordering...
assert gain[0.1]["diff"] - gain[1.0]["diff"] < 2 * math.hypot(gain[0.1]["diff_se"], gain[1.0]["diff_se"])  # ...in noise
for s in SEEDS:
    c, d = by_name[f"convit_f0.1_s{s}"], by_name[f"deit_f0.1_s{s}"]
    assert abs(c["val_top1"] - d["val_top1"]) <= 1.0  # the 500 validation images alone cannot tell them apart

start = torch.sigmoid(torch.tensor(1.0)).item()
for s in SEEDS:
    fall = {f: start - sum(by_name[f"convit_f{f:g}_s{s}"]["gates_end"]) / 4 for f in FRACTIONS}
    print(f"seed {s}: mean fall of σ(λ) over the GPSA layers by fraction:", {f: round(v, 3) for f, v in fall.items()})
    assert fall[0.1] > fall[0.3] > fall[1.0] > 0  # toward content, faster on fewer images
    end = by_name[f"convit_f0.1_s{s}"]["gates_end"]
    assert all(0.02 <= start - g <= 0.06 for g in end) and end[-1] < end[0]
    assert min(math.log(g / (1 - g)) for g in end) > 1 - 0.3  # λ (a layer's mean) moved by 0.3 at most
for r in table_runs:
    if r["model"] == "deit":
        last = torch.tensor(read_locality(RESULTS / r["name"] / "locality.json")[-1]["nonlocality"]).mean(-1)
        assert ((last - 4.14).abs() < 0.2).all(), r["name"]
deit_width = torch.tensor(histories["DeiT"][-1]["nonlocality"]).mean(-1)
convit_width = torch.tensor(histories["ConViT"][-1]["nonlocality"]).mean(-1)
print("f = 0.1, seed 0, final nonlocality per layer: DeiT", [f"{w:.2f}" for w in deit_width.tolist()],
      "ConViT", [f"{w:.2f}" for w in convit_width.tolist()])
assert ((deit_width - 4.14).abs() < 0.2).all()  # uniform attention on the 8 × 8 grid: 4.14
assert ((convit_width[:4] > 2.15) & (convit_width[:4] < 2.45)).all() and convit_width[3] > convit_width[0]

differences = {r["name"]: (r["test_top1"] - ours["convit"]) / ablation_se for r in rows_3}
print("Table 3, differences from (a) in standard errors:", {n: round(v, 2) for n, v in differences.items()})
assert all(abs(v) < 2.1 for v in differences.values())  # none clearly beyond noise
no_trainable_gpsa = ("deit", "frozen_gpsa", "frozen_gpsa_no_conv_init")
assert max(ours[n] for n in no_trainable_gpsa) < min(v for n, v in ours.items() if n not in no_trainable_gpsa)

# %% [markdown]
# ## Exercises
#
# **1. Pre-condition 3 at another batch.** Keep the design but train with `global_batch=64`: the same epochs,
# so about the same images and half the steps; the base learning rate unchanged, so DeiT's linear scaling rule
# doubles the peak. Predict first: does the learning-rate sum go up, down or stay? Then compute it for the f = 0.1 run
# with `run_config` and `learning_rate_sum` and set `lr_sum_64`.

# %%
lr_sum_64 = ...  # your answer: lr_sum_64 = ...

# %%
from convit_edu.checks import WrongAnswer, check_answer, expect_error, grade, reveal


def check_lr_sum_64(answer: float) -> None:
    cfg = run_config(CPU.run("convit", 0.1, 0), "unused", global_batch=64)
    want = learning_rate_sum(cfg, steps_per_epoch=500 // 64)
    check_answer(abs(answer - want) < 0.01, "build the config with run_config(..., global_batch=64); an epoch of "
                 "500 images is 500 // 64 steps (the last partial batch is dropped)")


grade("lr_sum_64", lr_sum_64, check_lr_sum_64)
print(expect_error(lambda: check_lr_sum_64(lr_sum / 2), WrongAnswer))

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(lr_sum_64):  # a reference answer, run when CONVIT_EDU_SOLUTIONS (or CI) is set
    cfg_64 = run_config(CPU.run("convit", 0.1, 0), "unused", global_batch=64)
    lr_sum_64 = learning_rate_sum(cfg_64, steps_per_epoch=500 // 64)
    print(f"batch 64: {cfg_64.epochs * (500 // 64)} steps, learning rates summing to {lr_sum_64:.2f} "
          f"(batch 32: {lr_sum:.2f}) — twice the rate for half the steps")

    grade("lr_sum_64", lr_sum_64, check_lr_sum_64)

# %% [markdown]
# **2. A standard error by hand.** Recompute the f = 0.3 cell's `diff_se` from its four records: the
# seed-to-seed standard error of the per-seed differences (ConViT − DeiT of the same seed, on the unseen
# images), combined in quadrature with the binomial standard error of the mean difference (each of the four
# top-1s p on n images contributes p(100 − p)/n, and the mean of two differences divides by 2). Set `se_03`.

# %%
se_03 = ...  # your answer: se_03 = ...

# %%
def check_se_03(answer: float) -> None:
    (row,) = [r for r in table_2(records) if r["fraction"] == 0.3]
    check_answer(abs(answer - row["diff_se"]) < 0.01, "two parts in quadrature: the standard deviation of the "
                 "two per-seed differences over √2, and √(Σ p(100 − p)/n over the four runs) / 2")


grade("se_03", se_03, check_se_03)

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(se_03):  # a reference answer, run when CONVIT_EDU_SOLUTIONS (or CI) is set
    pairs_03 = [(by_name[f"convit_f0.3_s{s}"], by_name[f"deit_f0.3_s{s}"]) for s in SEEDS]
    diffs_03 = [unseen_top1(c) - unseen_top1(d) for c, d in pairs_03]
    seed_se = statistics.stdev(diffs_03) / math.sqrt(len(diffs_03))
    binomial_se = math.sqrt(sum(unseen_top1(r) * (100 - unseen_top1(r)) / (r["val_images"] + r["heldout_images"])
                                for pair in pairs_03 for r in pair)) / len(pairs_03)
    se_03 = math.hypot(seed_se, binomial_se)
    print(f"seed-to-seed {seed_se:.2f}, binomial {binomial_se:.2f}: {se_03:.2f} points")
    grade("se_03", se_03, check_se_03)
    print(expect_error(lambda: check_se_03(seed_se), WrongAnswer))
