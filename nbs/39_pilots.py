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
# # The research log, part 1: the first design, pilots, and the rule that picks the grid
#
# This chapter and the next are the research log behind chapter 38's lesson: how the grid it reads came to
# be. The first design (below) ends in a diagnosis: at an 8 × 8 grid attention did little, the gates barely moved,
# and the uncertainty was unpaired. Before a second grid is believed, **pilots** look for a regime where the prior
# can matter: one seed each, at the smallest fraction (and at f = 1 where a pre-condition needs it), each changing
# one thing from a base. The base is the finer grid that a run on ten other classes pointed to (48-px images in
# 4-px patches: a 12 × 12 grid of 144 tokens), 60 000 images per run, the rest as in chapter 35. Every pilot runs in
# `fixed_test_split` folders (chapter 37) and is judged on its **500 dev images** and on chapter 36's
# pre-conditions only — never on the test images, which the final grid alone is judged on.
#
# Then the rule registered before the last pilots landed picks the design, at which the registered grid runs (Tables
# 2 and 3, 4 and 2 seeds, on a fixed test split: chapter 40 reads it), and the last section says what the pilots do
# and do not point to.
#
# The log's check cells read every number its prose quotes from the committed records, so that prose and records
# stay in step: bookkeeping, not evidence (one seed per pilot; the evidence is the standard errors they quote).

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
# %matplotlib inline
import json
import math
import warnings
from pathlib import Path

import matplotlib.pyplot as plt
import torch

from convit_edu.checks import check_answer
from convit_edu.config import TrainConfig
from convit_edu.optimisation import learning_rate_sum
from convit_edu.tables import check_preconditions, format_preconditions, format_table_2, table_2, unseen_top1
from convit_edu.zoo import create_model

# %% [markdown]
# ## The first design, and what it showed
#
# Chapter 35's first version of the laptop's grid (`results/sample-efficiency/`) chose every setting for the same two
# conditions as the final design — the DeiT short of data at small f, the ConViT's prior able to act — with less
# known:
#
# * **data**: the first 10 classes of the course's Tiny ImageNet at 64 px in 8 × 8-px patches, an 8 × 8 grid;
# * **models**: the final design's (width 72 in 9 heads of 8, depth 6, the ConViT's first 4 blocks GPSA);
# * **recipe**: the final design's light one, at a peak rate of 10⁻³ (a base rate of 1.6 × 10⁻² for 512);
# * **budget**: the optimiser steps of 120 000 images at batch 32 per run (24 epochs at f = 1, about 80 at f = 0.3,
#   250 at f = 0.1: 3 726–3 750 steps);
# * **evaluation**: top-1 on the 500 validation images **and** the training images the fraction left out (4 500 at
#   f = 0.1), so that a top-1's binomial standard error falls below a point at f < 1 (at f = 1 no image is left out,
#   and 500 images give about 2.2); two seeds per cell, each ConViT paired with the DeiT of its seed, the
#   uncertainty the seed-to-seed spread and the binomial noise of each score combined (chapter 36 keeps that rule
#   for these records);
# * **pre-conditions** (three): the DeiT at f = 0.1 at least 10 points below the DeiT at f = 1, the models fit
#   their training data at f = 0.1, and the gates can move (a learning-rate sum of at least 1.5).
#
# It first ran at batch 128 (936 steps a run, `results/sample-efficiency-b128/`), where the learning rates summed
# to under a half and no layer's mean gate moved by more than about 0.02; pre-condition (3) and the batch of 32 came
# from that. Every committed
# run of the first design is that design's config, but for where and how it ran:

# %%
from dataclasses import replace

from convit_edu.experiment_design import (ABLATIONS, ablation_grid, sample_efficiency_grid, sample_efficiency_scale,
                                         unique_runs)

FIRST_DESIGN = sample_efficiency_scale("data/tiny-imagenet-100", classes=10, class_sizes=(500,) * 10)
first_runs = unique_runs(sample_efficiency_grid(FIRST_DESIGN, [0.1, 0.3, 1.0], [0, 1]),
                         ablation_grid(FIRST_DESIGN, 0.1, names=list(ABLATIONS)))
where = ("data_root", "output", "num_workers", "progress", "resume")
for run in first_runs:
    recorded = TrainConfig.from_dict(json.loads((Path("results/sample-efficiency") / run.name / "run.json")
                                                .read_text())["config"])
    assert replace(recorded, **{k: getattr(run.config, k) for k in where}) == run.config, run.name
print(f"the {len(first_runs)} committed runs of the first design are its configs, but for {', '.join(where)}")

# %%
first = json.loads(Path("results/sample-efficiency/summary.json").read_text())
print(format_table_2(table_2(first)))
moved, rates = {}, {}
for folder in ("sample-efficiency-b128", "sample-efficiency"):
    records, run = (json.loads(Path(f"results/{folder}/{name}").read_text()) for name in
                    ("summary.json", "convit_f0.1_s0/run.json"))
    moved[folder] = max(abs(g - 1 / (1 + math.exp(-1))) for r in records if r["ablation"] is None
                        for g in r["gates_end"])
    rates[folder] = learning_rate_sum(TrainConfig.from_dict(run["config"]), run["steps_per_epoch"])
    print(f"{folder}: learning-rate sum {rates[folder]:.2f}; a GPSA layer's mean gate moved {moved[folder]:.3f} at most")
assert rates["sample-efficiency-b128"] < 0.5 and moved["sample-efficiency-b128"] < 0.025  # batch 128: the prose above
runs = {(r["model"], r["fraction"], r["seed"]): r for r in first if r["ablation"] is None}
for row in table_2(first):
    seeds = row["paired_seeds"]
    ahead = sum(unseen_top1(runs["convit", row["fraction"], s]) > unseen_top1(runs["deit", row["fraction"], s])
                for s in seeds)
    print(f"f = {row['fraction']:g}: ConViT - DeiT {row['diff']:+.1f} ± {row['diff_se']:.1f}; ConViT ahead in {ahead} "
          f"of {len(seeds)} seeds")
    assert abs(row["diff"]) < 2 * row["diff_se"]  # within noise at every fraction

# %% [markdown]
# **What it showed.** The ConViT ahead by about a point where data is scarce, in every seed pair at f ≤ 0.3, and
# the gain shrinking as f grows — the paper's ordering — but no cell beyond two standard errors. The gates moved
# a little toward content, the DeiT's attention stayed within 0.2 patch of uniform, and Table 3's rows (one seed)
# all sat within about two standard errors of the ConViT. The diagnosis: at 3 750 steps on 64 tokens, attention
# is a small part of what these models learn; the next design needed a regime where the prior can matter.
#
# ## The second design: pilots
#
# Each pilot changes one thing from the base, one seed, judged on the dev images. The command scores every run on the test split too, so the pilots' records hold test scores; the rule below reads
# none of them: it picks the design on the dev images alone.
#
# The pilots (scripts in `nbs/results/pilots/`, two or three at a time on the 2-core Intel Xeon (model 207,
# AVX-512 without BF16) while other work shared the cores, so their times are not this design's cost):

# %%
PILOTS = Path("results/pilots")  # nbs/results/pilots: one folder per pilot (pilots.sh, pilots-lr.sh, pilots-more.sh)
PILOT_CHANGES = {  # folder: what the pilot changes from the base
    "grid12": "base: 12 x 12 grid (48 px, 4-px patches), 60 000 images, lr 1.6e-2",
    "grid12-f1": "base, at f = 1",
    "lr2x": "learning rate doubled (3.2e-2)",
    "lr2x-f1": "learning rate doubled, at f = 1",
    "lr2x-90k": "learning rate doubled, 90 000 images",
    "lr2x-90k-f1": "learning rate doubled, 90 000 images, at f = 1",
    "gpsa5": "5 GPSA layers of 6 (ConViT only)",
    "alpha2": "locality strength 2 (ConViT only)",
    "aug-deit": "DeiT's full augmentation",
    "width96": "width 96, 12 heads",
}
pilots = {name: json.loads((PILOTS / name / "summary.json").read_text())
          for name in PILOT_CHANGES if (PILOTS / name / "summary.json").is_file()}
print(f"{'pilot':<12}{'run':<22}{'dev':>6}{'train':>7}{'gate moved':>11}{'lr sum':>7}   what it changes")
for name, pilot_records in pilots.items():
    for r in pilot_records:
        moved = max((abs(a - b) for a, b in zip(r["gates_start"], r["gates_end"])), default=None)
        print(f"{name:<12}{r['name']:<22}{r['val_top1']:>6.1f}{r['train_top1']:>7.1f}"
              f"{'-' if moved is None else format(moved, '.3f'):>11}{r['lr_sum']:>7.2f}   {PILOT_CHANGES[name]}")
print("not finished:", ", ".join(n for n in PILOT_CHANGES if n not in pilots) or "none")

# %% [markdown]
# The pre-conditions of each candidate design, from its pilots (dev images only):

# %%
designs = {"base": ("grid12", "grid12-f1"), "learning rate doubled": ("lr2x", "lr2x-f1"),
           "learning rate doubled, 90 000 images": ("lr2x-90k", "lr2x-90k-f1")}
verdicts = {}
for label, names in designs.items():
    design_records = [r for n in names for r in pilots.get(n, [])]
    if design_records:
        verdicts[label] = {c["name"][:2].strip(): c for c in check_preconditions(design_records)}
        print(f"{label}:\n{format_preconditions(check_preconditions(design_records))}\n")

# %% [markdown]
# What the base pilots say (one seed; on 500 dev images a top-1 has a binomial standard error of about 2.2
# points, so single differences of a point or two are noise):
#
# * **data is scarce (1)**: the DeiT loses 13.2 points from f = 1 (58.8 %) to f = 0.1 (45.6 %), and both models
#   fit all or nearly all of their 350 training images at f = 0.1 (99.4 and 100 %);
# * **the ConViT is ahead at both fractions by a similar, small margin**: 47.0 against 45.6 % at f = 0.1 and
#   60.4 against 58.8 % at f = 1 — within noise, and no larger where data is scarce. Early in training the
#   lead is larger: at the first evaluation, 27.0 against 23.6 % (f = 0.1) and 27.4 against 23.8 % (f = 1), the
#   paper's head start (Fig. 8b), smaller;
# * **the gates cannot move far (3)**: 60 000 images in batches of 32 at a peak rate of 10⁻³ sum to 0.93, and no
#   GPSA layer's mean gate moved by more than 0.024;
# * **f = 1 is not finished (4)**: the ConViT gained 4.0 points in its last quarter, and both models fit only 65
#   and 67 % of their f = 1 training images;
# * **attention, as trained, does not matter (2 fails)**: the same ConViT with its four GPSA layers *frozen* at
#   their convolutional initialization (Table 3's row f) reached 49.6 % — above the trained ConViT (47.0 %) and
#   the DeiT (45.6 %). What helps here is, at most, a fixed local attention; what training does to it does not
#   raise the accuracy. The first design's Table 3 said the same (freezing cost a point, within noise).
#
# Pre-conditions (3) and (4) fail for the same reason: too little optimisation. Doubling the learning rate (`lr2x`)
# brings the sum to 1.86 and the gates do move more — the last three GPSA layers' means by 0.053–0.055, passing
# (3b) — while the margin at f = 0.1 changes sign, within noise: DeiT 48.0, ConViT 46.2 % (the ConViT still ahead
# at the first evaluation, 29.8 against 27.4 %). At f = 1 the DeiT reached 59.2 %, 11.2 points above f = 0.1, so
# (1) holds, and the ConViT 56.6 %; but the ConViT still gained 4.0 points in its last quarter: (4) fails again.
# So does (2): frozen at initialization, the GPSA layers gave 48.2 % against the trained ones' 46.2 %. In both
# designs the frozen model is ahead from the first evaluation (28.4 against 27.0 %, 31.8 against 29.8 %): a fixed,
# convolution-like attention learns faster from the start, and training it gives nothing back by the end of these
# runs. A stronger locality, α = 2 (Fig. 8a), gave 44.4 %: no gain over α = 1 at this budget, within noise.
#
# More optimisation costs time. 90 000 images at the doubled rate (a sum of 2.84: `lr2x-90k`) is about the most a
# run fits in 25 minutes on one core: a training step of this ConViT alone on one idle core of the Xeon ran 76
# images/s (`benchmarks.measure_model`, batch 32; the DeiT 94), 20 minutes of steps before data loading, evaluation
# and a neighbour on the other core. The other pilots ask whether the prior can do more: a fifth GPSA layer of six
# (the paper's 10 of 12), DeiT's full augmentation (which the paper used), a wider model. The second round's other pilots
# (the 8 × 8 grid, whose answer the first design already gave; 90 000 images at the base rate, whose sum of 1.43
# fails (3) on paper; a 16 × 16 grid at 40 000 images) were dropped for `lr2x-90k`.
#
# At 90 000 images the gates move further (three GPSA layers' means by 0.057–0.067), but at f = 0.1 the DeiT is
# further ahead: 48.8 against 45.0 % (the ConViT again ahead at the first evaluation, 29.8 against 27.4 %). Across the
# three designs, as optimisation grows, the ConViT − DeiT dev gap at f = 0.1 goes +1.4, −1.8, −3.8 points: each
# inside the 3.1-point standard error of one gap (exercise 2), but all in one direction — here, longer training
# erodes the early head start instead of building on it. Frozen at initialization, the 90 000-image ConViT's GPSA
# layers gave 49.0 %, 4.0 points above the trained ones: in all three designs the frozen model is ahead (by 2.6,
# 2.0 and 4.0 points), and (2) fails.
#
# Two more pilots finished before the grid started. A fifth GPSA layer of six (`gpsa5`, at the base rate) reached
# 50.0 %: 3.0 points above the base ConViT and 0.4 above its frozen twin, inside one pilot's noise, with gates that
# moved no more than the base's (0.025 at most) — so it cannot say whether *training* the attention helps. At
# f = 1, the 90 000-image DeiT reached 61.4 %, 12.6 points above its f = 0.1 twin, and gained 1.6 points over its
# last quarter, under the 2-point bar; its ConViT twin was stopped after 3 of 17 epochs, so (4) is not checked for
# that design — which does not change the rule's answer, since the design does not fit the budget (below).
#
# The last two pilots, DeiT's full augmentation and a wider model, were stopped to give the grid both cores and
# finished after it, so nothing was chosen from them. **DeiT's full augmentation** (`aug-deit`: RandAugment of
# magnitude 9, Mixup 0.8, CutMix 1.0, random erasing 0.25, crops from 8 % of the image, at the base rate) ends the
# memorisation — both models fit 65–67 % of their training images instead of 99–100 % — and lifts the DeiT by 1.4
# dev points, to 47.0 %; the ConViT stays at 47.0 %: no gap. The head start reverses: at the first evaluation the
# ConViT is 6.2 points *behind* (19.6 against 25.8 %), and its gates move 0.020 at most. With the base rate's sum of
# 0.93 the heavier recipe leaves both models less trained; the paper pays for it with 300 epochs, this budget
# cannot. **A wider model** (`width96`: width 96 in 12 heads of 8, 1.8 times the parameters; the convolutional
# initialisation needs a square number of heads, so 9 start local as before and 3 keep random positional weights;
# chapter 03) gives the largest dev
# gap of any pilot, ConViT 50.0 against DeiT 46.4 % (+3.6, 1.1 standard errors of one gap, exercise 2), but the
# ConViT is behind at the first evaluation (26.4 against 29.2 %) and its gates move less than anywhere (0.011 at
# most): one seed, within noise, and not a gain of trained gates. Of all the pilots' single changes, it is the one
# that points somewhere: towards model size, which the grid did not vary (below).

# %%
base = {r["name"]: r for r in pilots["grid12"] + pilots["grid12-f1"] if r["ablation"] is None}
dev = {name: base[name]["val_top1"] for name in ("deit_f0.1_s0", "convit_f0.1_s0", "deit_f1_s0", "convit_f1_s0")}
assert dev == {"deit_f0.1_s0": 45.6, "convit_f0.1_s0": 47.0, "deit_f1_s0": 58.8, "convit_f1_s0": 60.4}
first_eval = {name: base[name]["val_curve"][0][1] for name in dev}
assert first_eval == {"deit_f0.1_s0": 23.6, "convit_f0.1_s0": 27.0, "deit_f1_s0": 23.8, "convit_f1_s0": 27.4}
checks = verdicts["base"]
assert checks["1"]["passed"] and round(checks["1"]["value"], 1) == 13.2
assert checks["3a"]["passed"] is False and round(checks["3a"]["value"], 2) == 0.93
assert checks["3b"]["passed"] is False and checks["3b"]["value"] < 0.025
assert checks["4"]["passed"] is False and round(checks["4"]["value"], 1) == 4.0
assert [round(base[n]["train_top1"]) for n in ("convit_f1_s0", "deit_f1_s0")] == [65, 67]
lr2x = {r["name"]: r for r in pilots["lr2x"]}
assert round(lr2x["convit_f0.1_s0"]["lr_sum"], 2) == 1.86 and verdicts["learning rate doubled"]["3b"]["passed"]
assert [round(abs(a - b), 3) for a, b in zip(lr2x["convit_f0.1_s0"]["gates_start"],
                                           lr2x["convit_f0.1_s0"]["gates_end"])][1:] == [0.053, 0.055, 0.053]
assert (lr2x["deit_f0.1_s0"]["val_top1"], lr2x["convit_f0.1_s0"]["val_top1"]) == (48.0, 46.2)
assert (lr2x["deit_f0.1_s0"]["val_curve"][0][1], lr2x["convit_f0.1_s0"]["val_curve"][0][1]) == (27.4, 29.8)
frozen = {r["ablation"]: r for r in pilots["grid12"]}["frozen_gpsa"]
assert frozen["val_top1"] == 49.6 and checks["2"]["passed"] is False and round(checks["2"]["value"], 1) == -2.6
lr2x_f1, lr2x_checks = {r["name"]: r for r in pilots["lr2x-f1"]}, verdicts["learning rate doubled"]
assert (lr2x_f1["deit_f1_s0"]["val_top1"], lr2x_f1["convit_f1_s0"]["val_top1"]) == (59.2, 56.6)
assert round(lr2x_checks["1"]["value"], 1) == 11.2 and lr2x_checks["3a"]["passed"]
assert lr2x_checks["4"]["passed"] is False and round(lr2x_checks["4"]["value"], 1) == 4.0
lr2x_frozen = {r["ablation"]: r for r in pilots["lr2x"]}["frozen_gpsa"]
assert lr2x_frozen["val_top1"] == 48.2 and lr2x_checks["2"]["passed"] is False
assert (frozen["val_curve"][0][1], lr2x_frozen["val_curve"][0][1]) == (28.4, 31.8)
assert round(verdicts["learning rate doubled, 90 000 images"]["3a"]["value"], 2) == 2.84
lr2x_90k = {r["name"]: r for r in pilots["lr2x-90k"]}
convit_90k = lr2x_90k["convit_f0.1_s0"]
moves = [round(a - b, 3) for a, b in zip(convit_90k["gates_start"], convit_90k["gates_end"])]
assert min(moves[1:]) == 0.057 and max(moves) == 0.067, moves
assert (lr2x_90k["deit_f0.1_s0"]["val_top1"], lr2x_90k["convit_f0.1_s0"]["val_top1"]) == (48.8, 45.0)
assert (lr2x_90k["deit_f0.1_s0"]["val_curve"][0][1], lr2x_90k["convit_f0.1_s0"]["val_curve"][0][1]) == (27.4, 29.8)
gaps = [round(d["convit_f0.1_s0"]["val_top1"] - d["deit_f0.1_s0"]["val_top1"], 1) for d in (base, lr2x, lr2x_90k)]
assert gaps == [1.4, -1.8, -3.8], gaps

# %%
runs = [d["convit_f0.1_s0"] for d in (base, lr2x, lr2x_90k)]  # the three designs' ConViTs at f = 0.1
sums = [r["lr_sum"] for r in runs]
moved = [max(abs(a - b) for a, b in zip(r["gates_start"], r["gates_end"])) for r in runs]
fig, ax = plt.subplots(figsize=(5.5, 2.8), dpi=80)
ax.plot(sums, gaps, "o-", label="ConViT − DeiT, dev top-1 at f = 0.1 (points)")
ax.axhline(0, color="grey", lw=0.8)
ax2 = ax.twinx()
ax2.plot(sums, moved, "s--", color="tab:orange", label="the ConViT's largest gate movement (right)")
ax.set(xlabel="learning-rate sum of the run", ylabel="points", title="Pilots: more optimisation, no ConViT lead")
ax2.set_ylabel("max |Δσ(λ)|")
fig.legend(loc="lower left", fontsize=7, bbox_to_anchor=(0.12, 0.18))
plt.show()
frozen_90k = {r["ablation"]: r for r in pilots["lr2x-90k"]}["frozen_gpsa"]
assert frozen_90k["val_top1"] == 49.0 and verdicts["learning rate doubled, 90 000 images"]["2"]["passed"] is False
frozen_leads = [round(-verdicts[label]["2"]["value"], 1) for label in designs]
assert frozen_leads == [2.6, 2.0, 4.0], frozen_leads
assert pilots["alpha2"][0]["val_top1"] == 44.4
gpsa5 = pilots["gpsa5"][0]
assert gpsa5["val_top1"] == 50.0 and round(gpsa5["val_top1"] - frozen["val_top1"], 1) == 0.4
assert max(abs(a - b) for a, b in zip(gpsa5["gates_start"], gpsa5["gates_end"])) < 0.026
(deit_90k_f1,) = pilots["lr2x-90k-f1"]
checks_90k = verdicts["learning rate doubled, 90 000 images"]
assert deit_90k_f1["val_top1"] == 61.4 and round(checks_90k["1"]["value"], 1) == 12.6
assert checks_90k["4"]["passed"] is None and round(checks_90k["4"]["value"], 1) == 1.6  # no ConViT at f = 1
aug = {r["model"]: r for r in pilots["aug-deit"]}
assert (aug["deit"]["val_top1"], aug["convit"]["val_top1"]) == (47.0, 47.0) and base["deit_f0.1_s0"]["val_top1"] == 45.6
assert [round(aug[m]["train_top1"]) for m in ("convit", "deit")] == [65, 67]
assert (aug["convit"]["val_curve"][0][1], aug["deit"]["val_curve"][0][1]) == (19.6, 25.8)
assert round(max(abs(a - b) for a, b in zip(aug["convit"]["gates_start"], aug["convit"]["gates_end"])), 3) == 0.020
wide = {r["model"]: r for r in pilots["width96"]}
gap_se = math.sqrt(sum(wide[m]["val_top1"] * (100 - wide[m]["val_top1"]) / wide[m]["val_images"] for m in wide))
assert (wide["convit"]["val_top1"], wide["deit"]["val_top1"]) == (50.0, 46.4) and round(3.6 / gap_se, 1) == 1.1
assert (wide["convit"]["val_curve"][0][1], wide["deit"]["val_curve"][0][1]) == (26.4, 29.2)
assert round(max(abs(a - b) for a, b in zip(wide["convit"]["gates_start"], wide["convit"]["gates_end"])), 3) == 0.011
with warnings.catch_warnings(record=True) as caught:  # 12 heads: chapter 03's warning, once per GPSA layer
    warnings.simplefilter("always")
    widths = {d: sum(p.numel() for p in create_model("convit_tiny", img_size=48, patch_size=4, embed_dim=d,
                                                       num_heads=d // 8, depth=6, num_classes=10,
                                                       local_up_to_layer=4).parameters()) for d in (72, 96)}
assert round(widths[96] / widths[72], 1) == 1.8, widths
assert len(caught) == 4 and all("only 9 heads get a convolutional" in str(w.message) for w in caught)


# %% [markdown]
# ### The rule that picks the design, and the grid it will run
#
# Written before the remaining pilots land: the final design is, among the pilots' designs whose runs fit 25
# minutes on one core (two side by side) and that pass all four pre-conditions on their dev images, the one with
# the largest ConViT − DeiT dev top-1 at f = 0.1. If none passes, the chapter says which pre-condition failed
# and what budget the pilots point to. The grid at that design is then registered here before it runs:
#
# * Table 2: ConViT and DeiT at f = 0.1 and f = 1 (0.3 if the budget allows), **4 seeds**, every run scored on
#   the same 1 500 test images (150 per class);
# * Table 3: the ablations `frozen_gate`, `no_conv_init`, `frozen_gpsa` and App. A's `psa` at f = 0.1, 2 seeds;
# * **the endpoint**: ConViT − DeiT test top-1 at f = 0.1 more than 2 paired-bootstrap standard errors above
#   zero, *and* the relative gain at f = 0.1 larger than at f = 1 — reported whichever way it comes out.
#
# Added when the first two designs had failed pre-conditions 2 and 4, before the 90 000-image ConViT, its frozen
# twin and its f = 1 pilots had finished: if no design passes, the grid still runs, at the design that fails the
# fewest pre-conditions (a tie: the one with more images per run), and its tables are reported with the failed
# pre-conditions beside them — a measurement of the endpoint, not evidence for or against the paper; its Table 3
# `frozen_gpsa` rows, paired on the test images, then re-measure pre-condition 2 with more than one pilot's noise.

# %% [markdown]
# ### What a run costs, measured
#
# The pilots' own times are not a design's cost: other work shared the cores. So one ConViT and one DeiT of the
# doubled-rate design ran side by side, one core each, with nothing else running (the pilots paused), 7 000 images
# each, at f = 1 and then at f = 0.1 (`results/pilots/cost/`: the commands, their logs, and each command's wall
# clock). A run's time is then its training loop's seconds per image — evaluations included: every design evaluates
# once per f = 1 epoch's worth of steps, in the short runs as in the long ones — times its images, plus what a
# command costs whatever its length (start, the test split, scoring the 1 500 test images, the summary):

# %%
COST = PILOTS / "cost"  # Intel Xeon (model 207, 2 cores, AVX-512 without BF16), two runs side by side
wall = json.loads((COST / "cost.json").read_text())["wall_s"]


def run_minutes(model: str, fraction: float, images: int) -> float:
    """Projected wall-clock minutes of one run of `images` images, from the measured short run."""
    name = f"{model}_f{fraction:g}_s0"
    rows = [json.loads(line) for line in (COST / name / "log.jsonl").read_text().splitlines()]
    run = json.loads((COST / name / "run.json").read_text())
    trained = run["steps_per_epoch"] * run["config"]["epochs"] * run["global_batch"]
    return (rows[-1]["time_s"] / trained * images + wall[name] - rows[-1]["time_s"]) / 60


cost = {(m, f, n): run_minutes(m, f, n) for m in ("convit", "deit") for f in (0.1, 1.0) for n in (60_000, 90_000)}
for (m, f, n), minutes in cost.items():
    print(f"{m:<7} f = {f:<4} {n:>6} images: {minutes:5.1f} min")
assert max(v for (m, f, n), v in cost.items() if n == 60_000) < 18 < 25 < cost["convit", 1.0, 90_000] < 25.5
assert [round(cost["convit", f, 90_000], 1) for f in (0.1, 1.0)] == [24.5, 25.2]
assert round(cost["convit", 1.0, 60_000]) == 17
per_image = {f: (cost["convit", f, 90_000] - cost["convit", f, 60_000]) / 30_000 for f in (0.1, 1.0)}
assert round(100 * (per_image[1.0] / per_image[0.1] - 1)) == 3  # the two fractions' rates differ by 3 %
fits = 60_000 + (25 - cost["convit", 1.0, 60_000]) / per_image[1.0]  # the most images a 25-minute run takes
assert 89_000 < fits < 90_000, fits

# %% [markdown]
# A run of 60 000 images takes at most about 17 minutes (the ConViT at f = 1); one of 90 000 images 24.5 minutes
# at f = 0.1 and **25.2 at f = 1: over the 25-minute budget**, by less than this measurement's own spread (the two
# fractions' rates differ by 3 %). The rule asks for runs that fit, so the 90 000-image design, at the limit, is
# left out as written; a run of 89 000 images would fit.
#
# **Does a 16 × 16 grid pay for its cost?** (dropped from the pilots above). Measured instead of run: one training
# step of the pilots' ConViT and DeiT at 48-px and 64-px images in 4-px patches, batch 32, one thread, the machine
# otherwise idle (the grid below paused; `results/pilots/cost/grid16.py`, its output `grid16.json`). A 16 × 16 run
# is taken to cost the 12 × 12 one's minutes times the ratio of the two step rates (evaluation and scoring grow
# with the tokens too), and its learning-rate sum to scale with its steps like the pilots' (1.86 at 60 000 images):

# %%
steps_per_s = json.loads((COST / "grid16.json").read_text())["train_images_per_s"]
dearer = steps_per_s["convit_tiny_48px"] / steps_per_s["convit_tiny_64px"]
images_16 = (25 / dearer - cost["convit", 1.0, 60_000] + 60_000 * per_image[1.0]) / per_image[1.0]
lr_sum_16 = lr2x["convit_f0.1_s0"]["lr_sum"] * images_16 / 60_000
print(f"ConViT {steps_per_s['convit_tiny_48px']:.1f} images/s at 12 x 12, {steps_per_s['convit_tiny_64px']:.1f} at "
      f"16 x 16 ({dearer:.2f} x dearer; DeiT {steps_per_s['deit_tiny_48px']:.1f} and "
      f"{steps_per_s['deit_tiny_64px']:.1f}): a 25-minute 16 x 16 run takes about {images_16:,.0f} images, "
      f"a learning-rate sum of {lr_sum_16:.2f} at the doubled rate")
assert round(dearer, 1) == 2.3 and round(images_16, -3) == 37_000 and round(images_16 / 60_000, 1) == 0.6
assert round(lr_sum_16, 1) == 1.1 < 1.5

# %% [markdown]
# A 16 × 16 grid costs the ConViT about 2.3 times a 12 × 12 one per image, so the budget buys it about 37 000
# images — 0.6 of the chosen design's — and a learning-rate sum of about 1.1 at the doubled rate, which fails (3a)
# before a run starts; and (4), f = 1 still climbing at 60 000 images, would only get worse. Within 25 minutes on
# one core, the finer grid does not pay for itself here.
#
# ### The rule, applied
#
# No design passes all four pre-conditions: all three fail (2) — a frozen GPSA does as well as a trained one — and both
# whose f = 1 pilots finished fail (4), the ConViT at f = 1 still climbing. So the registered fallback applies: among
# the designs that fit the budget, the one that fails the fewest pre-conditions (a pre-condition not checked counts as
# failed: the single-change pilots at f = 0.1 alone check two of five). That is **the doubled learning rate** (`lr2x`:
# it fails (2) and (4)) over the base (it fails four). Its grid (`results/second-design/grid.sh`, seeds 1-4, seed 0 left
# to the pilots; Table 3's ablations with seeds 1 and 3) took 6.2 hours of one core; its tables are reported below,
# with (2) and (4) failed beside them.

# %%
fitting = {"base": ("grid12", "grid12-f1"), "learning rate doubled": ("lr2x", "lr2x-f1")}  # 60 000 images each
failed = {label: sum(c["passed"] is not True for c in verdicts[label].values()) for label in fitting}
print("pre-conditions failed or not checked, per design that fits:", failed)
assert min(failed, key=failed.get) == "learning rate doubled" and failed == {"base": 4, "learning rate doubled": 2}
runs = {("convit", 0.1): 4 + 8, ("deit", 0.1): 4, ("convit", 1.0): 4, ("deit", 1.0): 4}  # 8 ablations at f = 0.1
grid_hours = sum(k * cost[m, f, 60_000] for (m, f), k in runs.items()) / 60
print(f"the grid: {grid_hours:.1f} hours of one core")
assert round(grid_hours, 1) == 6.2

# %% [markdown]
# **What budget the pilots point to** (with the grid's result, chapter 40). Within 25 minutes a run on one core, no design the pilots tried shows the
# effect, and the lever they measured points away from more of the same: as the learning-rate sum grew from 0.93
# to 1.86 and 2.84, the single-seed dev gap at f = 0.1 went +1.4, −1.8 and −3.8 points, and the grid's four seeds
# at the middle design give −0.27 ± 1.0 on the test images; a 16 × 16 grid does not fit the budget; DeiT's full
# augmentation, at this budget, closes no gap and removes the head start. What the grid did not vary is how much data
# the prior competes with and the model's size — 350 training images at f = 0.1 where the paper has 128 000, 400 000
# parameters where it has 27 million — and that is where the paper measured its effect. One pilot touched model
# size: 1.8 times the parameters gave the pilots' largest dev gap, +3.6 points, one seed at 1.1 standard errors. It
# costs the ConViT 1.44 times as much per image (56.6 against 81.7 training images/s, one idle thread,
# `results/pilots/cost/width96.py`), so a 60 000-image run at f = 1 takes at most about 25 minutes by the measured
# cost above (measured before the denormal flush, so an upper bound): at the budget's edge. That is where the pilots
# point, measured once: a registered grid at width 96 or more, not more optimisation of this model. So the course does
# not claim the effect is absent: only that it is not visible at this scale, beyond a head start early in training.

# %%
width_rates = json.loads((COST / "width96.json").read_text())["train_images_per_s"]
width_dearer = width_rates["convit_tiny_width72"] / width_rates["convit_tiny_width96"]
print(f"ConViT {width_rates['convit_tiny_width72']:.1f} images/s at width 72, {width_rates['convit_tiny_width96']:.1f}"
      f" at width 96: a 60 000-image run at f = 1 about {cost['convit', 1.0, 60_000] * width_dearer:.0f} minutes")
assert round(width_dearer, 2) == 1.44 and round(cost["convit", 1.0, 60_000] * width_dearer) == 25

# %% [markdown]
# ## Exercises
#
# **1. Pre-condition 4 by hand.** Was f = 1 trained to a fair point? Over the last quarter of its evaluations no
# model at f = 1 may still gain 2 points or more. Each record keeps `val_curve`, the (step, dev top-1) pairs of its
# evaluations. Write `last_quarter_gain(records)`: over the f = 1 runs among `records`, the largest gain of a run's
# final dev top-1 over its dev top-1 n // 4 evaluations earlier (n: that run's number of evaluations).

# %%
last_quarter_gain = ...  # your answer: def last_quarter_gain(records): ...

# %%
from convit_edu.checks import demonstrate, grade, reveal


def check_last_quarter_gain(fn) -> None:
    for label, names in designs.items():
        design_records = [r for n in names for r in pilots.get(n, [])]
        want = check_preconditions(design_records)[4]["value"] if design_records else None
        if want is not None:  # a design whose f = 1 pilots have not finished has nothing to check yet
            got = fn(design_records)
            check_answer(abs(got - want) < 1e-9, f"{label}: {got:.1f} points where pre-condition 4 finds {want:.1f}: "
                         "every model at f = 1 counts, not the DeiT alone, and the gain is the final dev top-1 minus "
                         "the one n // 4 evaluations earlier")


def a_gain(models: tuple[str, ...] = ("deit", "convit"), back=lambda n: n // 4):
    """last_quarter_gain with the slips asked for: the wrong answers the check is shown on."""
    def gain(records: list[dict]) -> float:
        curves = [[top1 for _, top1 in r["val_curve"]] for r in records
                  if r["fraction"] == 1.0 and r["model"] in models]
        return max(c[-1] - c[-1 - back(len(c))] for c in curves)
    return gain


grade("last_quarter_gain", last_quarter_gain, check_last_quarter_gain)
print({label: round(v["4"]["value"], 1) for label, v in verdicts.items() if v["4"]["value"] is not None})
demonstrate(check_last_quarter_gain, {"the DeiT alone": a_gain(models=("deit",)),
                                      "the gain over the whole curve": a_gain(back=lambda n: n - 1)})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(last_quarter_gain):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def last_quarter_gain(records: list[dict]) -> float:
        gains = []
        for r in records:
            if r["fraction"] == 1.0:
                curve = [top1 for _, top1 in r["val_curve"]]
                gains.append(curve[-1] - curve[-1 - len(curve) // 4])
        return max(gains)

    grade("last_quarter_gain", last_quarter_gain, check_last_quarter_gain)

# %% [markdown]
# **2. How sure is one pilot?** Pre-condition 2 failed for the base design: the ConViT with its GPSA frozen at
# initialization scored 49.6 % on the 500 dev images, the trained ConViT 47.0 %. Treat the two scores as independent
# binomial estimates (an upper bound: both models see the same images, chapter 36) and compute `se_gap`, the
# standard error of their difference in points, and `z`, the frozen model's lead in those standard errors.

# %%
se_gap, z = ..., ...  # your answer: se_gap, z = ...

# %%
grid12_runs = {r["name"]: r for r in pilots["grid12"]}
frozen_run, trained_run = grid12_runs["frozen_gpsa_f0.1_s0"], grid12_runs["convit_f0.1_s0"]
score_se = [math.sqrt(r["val_top1"] * (100 - r["val_top1"]) / r["val_images"]) for r in (frozen_run, trained_run)]
gap = frozen_run["val_top1"] - trained_run["val_top1"]
assert gap / math.hypot(*score_se) < 1  # the prose below: the frozen model's lead is within one standard error


def check_gap(answer: tuple[float, float]) -> None:
    se, z_value = answer
    want = math.hypot(*score_se)
    check_answer(abs(se - want) < 0.01, f"{se:.2f} points, not {want:.2f}: each score's variance is p(100 − p)/n "
                 "in points², the difference's is their sum, and its standard error the square root")
    check_answer(abs(z_value - gap / want) < 0.01, "z is the gap in points divided by se_gap: a number of standard "
                 "errors")


grade("se_gap, z", (se_gap, z), check_gap)
demonstrate(check_gap, {"one score's standard error alone": (score_se[0], gap / score_se[0]),
                        "the two standard errors added": (sum(score_se), gap / sum(score_se)),
                        "z left as the gap in points": (math.hypot(*score_se), gap)})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(se_gap, z):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    p_frozen, p_trained, n_dev = 49.6, 47.0, 500
    se_gap = math.sqrt(p_frozen * (100 - p_frozen) / n_dev + p_trained * (100 - p_trained) / n_dev)
    z = (p_frozen - p_trained) / se_gap
    print(f"standard error of the gap {se_gap:.2f} points: the frozen model leads by {z:.2f} of them")
    grade("se_gap, z", (se_gap, z), check_gap)

# %% [markdown]
# The frozen model's lead is under one standard error: pre-condition 2 fails because the trained attention shows
# no gain over a frozen one, not because training it is shown to hurt. A 3-point threshold is itself about one
# standard error of a single-seed gap, so the pre-condition is a screen: the grid's Table 3, with two seeds of the
# frozen-GPSA ablation scored on 1 500 test images and paired, is what can say more.
