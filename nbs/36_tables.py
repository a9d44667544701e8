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
# # From records to Tables 2 and 3: comparing two models beyond noise
#
# A grid of runs (chapter 35's design, chapter 37's command) leaves one record per run: which model, which
# fraction f of the training images, which seed, and how it scored. This chapter turns records into the paper's
# Table 2 (ConViT against DeiT on each fraction) and Table 3 (the ablations), and asks the question the paper's
# single runs cannot: is a difference of a point or two between two models more than noise? With few seeds and
# a test set of a few thousand images, the answer depends on *how* the noise is estimated. Scoring both models
# on the same images and comparing them image by image (a **paired** comparison) sees differences that two
# separate error bars hide. Before believing a grid at all, four **pre-conditions** of its design are checked
# by code.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp tables
# From a grid's records to the paper's Tables 2 and 3: test top-1, paired standard errors, the pre-conditions.

# %%
#| export
import math

import torch
from matplotlib.figure import Figure

from convit_edu.experiment_design import ABLATIONS

# %%
# %matplotlib inline
from convit_edu.checks import WrongAnswer, check_answer, expect_error

# %% [markdown]
# ## The paper's gap
#
# Table 2 reports, for each fraction, the top-1 of both models and the ConViT's relative improvement over the
# DeiT, (ConViT − DeiT) / DeiT: at f = 5 % of ImageNet, 47.8 % against 34.8 %, a gap of 37 %.

# %%
#| export
def relative_gain(convit: float, deit: float) -> float:
    """The paper's "Gap" (Table 2): (ConViT − DeiT) / DeiT, in %."""
    if deit <= 0:
        raise ValueError(f"the DeiT accuracy {deit} must be > 0 to compute a relative gain")
    return 100 * (convit - deit) / deit




# %%
assert round(relative_gain(47.8, 34.8)) == 37  # Table 2, f = 5 %
print(expect_error(lambda: relative_gain(50.0, 0.0)))

# %% [markdown]
# ## From records to tables
#
# `summary.json` is the list of the finished runs' records. Table 2 pairs the ConViT and the DeiT of each seed
# and fraction. In a `fixed_test_split` folder both are scored on the same test images at every fraction, and
# the uncertainty is **paired** (`paired_bootstrap`): it redraws the seeds and the test images with
# replacement, the same images for both models, so an image both get right or both get wrong adds no noise to
# their difference. The first design (chapter 39) had no such split: there the score is on every image neither
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

    def weights(k: int, n: int) -> torch.Tensor:  # (k, n): how often each of n items is drawn, over n
        draws = torch.randint(n, (k, n), generator=g)
        return torch.zeros(k, n, dtype=torch.float64).scatter_add_(1, draws, torch.ones(k, n, dtype=torch.float64)) / n

    boot_c, boot_d = [], []
    for start in range(0, resamples, 100):  # 100 resamples at a time: 50 000 test images stay under 100 MB
        k = min(100, resamples - start)
        images, seeds = weights(k, c.shape[1]), weights(k, c.shape[0])
        boot_c.append(100 * ((images @ c.T) * seeds).sum(dim=1))
        boot_d.append(100 * ((images @ d.T) * seeds).sum(dim=1))
    boot_c, boot_d = torch.cat(boot_c), torch.cat(boot_d)
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
    """The ablations on ``fraction`` in ``ABLATIONS`` order: name, Table 3 row, seeds, mean test and val top-1, and
    ``vs_convit`` ± ``vs_convit_se``: the row minus the ConViT of the same seeds, paired over the test images
    (``paired_bootstrap``), or None where those runs did not save their per-image answers."""
    cells = {name: [r for r in records if r["fraction"] == fraction and r["model"] == a.model
                    and r["ablation"] == (None if name in ("convit", "deit") else name)]
             for name, a in ABLATIONS.items()}
    convit = {r["seed"]: r for r in cells["convit"]}
    rows = []
    for name, runs in cells.items():
        if not runs:
            continue
        paired = [(r, convit[r["seed"]]) for r in runs if r["seed"] in convit]
        stats = None
        if name != "convit" and paired and all("test_correct" in r for pair in paired for r in pair):
            stats = paired_bootstrap([r["test_correct"] for r, _ in paired], [c["test_correct"] for _, c in paired])
        a = ABLATIONS[name]
        rows.append({"name": name, "table_ref": a.table_ref, "label": a.label, "seeds": len(runs),
                     "test_top1": sum(map(test_top1, runs)) / len(runs),
                     "val_top1": sum(r["val_top1"] for r in runs) / len(runs),
                     "vs_convit": stats and stats["diff"], "vs_convit_se": stats and stats["diff_se"]})
    return rows


def format_table_3(rows: list[dict]) -> str:
    """Table 3's rows with their test and dev top-1 and, where paired, the difference to the ConViT."""
    lines = [f"{'row':<7}{'run':<27}{'seeds':>5}{'test top-1':>11}{'val top-1':>10}   vs ConViT (paired)"]
    for r in rows:
        paired = "" if r["vs_convit"] is None else f"   {r['vs_convit']:+5.1f} ± {r['vs_convit_se']:.1f} pt"
        lines.append(f"{r['table_ref']:<7}{r['label']:<27}{r['seeds']:>5}{r['test_top1']:>11.1f}"
                     f"{r['val_top1']:>10.1f}{paired}")
    return "\n".join(lines)

# %% [markdown]
# ### Why pairing matters
#
# Two models scored on the same 1,500 test images, four seeds each. They agree on most images — both get the
# easy ones right and the hard ones wrong — and differ on a few: here the ConViT alone gets 75 images right,
# the DeiT alone 45, so the ConViT leads by 2 points. Scored separately, each accuracy has a binomial noise of
# about √(0.5 · 0.5 / 1,500) ≈ 1.3 points, and their difference √2 times that, 1.8 points: 2 points would look
# like noise. Compared image by image, only the 120 images on which they disagree carry noise, about
# √120 / 1,500 ≈ 0.73 point. And since every seed is scored on the same test images, more seeds shrink that
# part only down to a floor set by the number of test images. (The first design's `_seed_and_binomial` ignored both facts: it scored
# the models separately, and divided the binomial noise by the number of seeds as if each seed had its own
# images.)

# %%
g = torch.Generator().manual_seed(0)
both = (torch.rand(4, 1500, generator=g) < 0.5).long()  # what both get right, per seed
deit_answers, convit_answers = both.clone(), both.clone()
convit_answers[:, :75], deit_answers[:, :75] = 1, 0  # the ConViT alone gets these right
convit_answers[:, 75:120], deit_answers[:, 75:120] = 0, 1  # the DeiT alone these
text = [["".join(map(str, run.tolist())) for run in runs] for runs in (convit_answers, deit_answers)]
one_seed, four_seeds = paired_bootstrap(text[0][:1], text[1][:1]), paired_bootstrap(*text)
p_c, p_d = (answers[0].float().mean().item() for answers in (convit_answers, deit_answers))
unpaired = 100 * math.sqrt((p_c * (1 - p_c) + p_d * (1 - p_d)) / 1500)
print(f"ConViT − DeiT = {four_seeds['diff']:+.2f} points; standard error of one seed scored separately "
      f"{unpaired:.2f}, paired {one_seed['diff_se']:.2f}; paired over four seeds {four_seeds['diff_se']:.2f}")
assert round(four_seeds["diff"], 6) == 2.0 and one_seed["diff_se"] < unpaired / 2
assert abs(four_seeds["diff_se"] - one_seed["diff_se"]) < 0.1  # the same images: four seeds do not shrink it

# %% [markdown]
# The bootstrap also redraws the seeds, so a grid whose seeds disagree gets a wider error than one whose
# seeds agree, even with the same mean difference: here two seeds favour the ConViT on 80 more images and
# two favour the DeiT on the same 80.

# %%
noisy_convit, noisy_deit = convit_answers.clone(), deit_answers.clone()
noisy_convit[:2, 120:200], noisy_deit[:2, 120:200] = 1, 0  # seeds 0 and 1: the ConViT alone right on 80 more
noisy_convit[2:, 120:200], noisy_deit[2:, 120:200] = 0, 1  # seeds 2 and 3: the DeiT alone right on them
spread = paired_bootstrap(*[["".join(map(str, r.tolist())) for r in runs] for runs in (noisy_convit, noisy_deit)])
print(f"seeds that disagree: ConViT − DeiT = {spread['diff']:+.2f} ± {spread['diff_se']:.2f} points")
assert round(spread["diff"], 6) == 2.0
assert spread["diff_se"] > four_seeds["diff_se"]

# %% [markdown]
# ## Pre-conditions: is this a grid that *could* show the effect?
#
# A grid can fail to show the paper's effect because the effect is not there, or because the design gives it no
# chance. Chapter 35's first design stated three pre-conditions; its second design (chapter 40's grid) has these
# four, whose (2) is another condition than the first design's (2), "the models fit their training data" (chapter
# 38 checks that one). `check_preconditions` checks the four on a grid's records, on the
# images training is scored on (the dev images, `val/`), never on the test images, so the design can be
# chosen and checked without looking at the result it is meant to test:
#
# 1. **data is scarce**: the DeiT on the smallest fraction is at least 10 points below the DeiT at f = 1;
# 2. **attention matters**: a ConViT whose GPSA layers are frozen at their initialization (Table 3's row f)
#    is at least 3 points below the trained ConViT — otherwise there is little for a prior on attention to do;
# 3. **the gates can move and do**: the schedule's learning rates sum to at least 1.5 (AdamW moves a parameter
#    by roughly the learning rate per step, so λ could go from 1 to below 0 or above 2), and some GPSA
#    layer's mean σ(λ) moved by at least 0.05;
# 4. **f = 1 is trained to a fair point**: neither model at f = 1 gained 2 points of dev top-1 or more over
#    the last quarter of its evaluations (not stopped half-way up its curve).
#
# A pre-condition whose runs are missing is reported as not checked, not as passed.

# %%
#| export
def _mean(runs: list[dict], key: str) -> float | None:
    return sum(r[key] for r in runs) / len(runs) if runs else None


def _check(name: str, value: float | None, threshold: float, needs: str, above: bool = True) -> dict:
    passed = None if value is None else (value >= threshold if above else value < threshold)
    return {"name": name, "passed": passed, "value": value, "needs": needs}


def check_preconditions(records: list[dict]) -> list[dict]:
    """The second design's four pre-conditions of a Table 2 grid (this chapter), from its records' dev top-1 (``val_top1``) at the smallest
    fraction: one dict per check with ``name``, ``passed`` (None when its runs are missing), ``value``, ``needs``."""
    low = min(r["fraction"] for r in records)
    runs = lambda model, f, ablation=None: [r for r in records if r["model"] == model and r["fraction"] == f
                                            and r["ablation"] == ablation]
    deit_low, deit_full = _mean(runs("deit", low), "val_top1"), _mean(runs("deit", 1.0), "val_top1")
    convit_low, frozen = _mean(runs("convit", low), "val_top1"), _mean(runs("convit", low, "frozen_gpsa"), "val_top1")
    lr_sums = [r.get("gate_lr_sum", r["lr_sum"]) for r in records if "lr_sum" in r]  # older records: no gate scale
    moves = [max(abs(a - b) for a, b in zip(r["gates_start"], r["gates_end"])) for r in runs("convit", low)]
    gap = lambda a, b: None if a is None or b is None else a - b
    return [_check("1 data is scarce", gap(deit_full, deit_low), 10, f"DeiT f = 1 minus f = {low:g}: >= 10 points"),
            _check("2 attention matters", gap(convit_low, frozen), 3, "ConViT minus frozen GPSA: >= 3 points"),
            _check("3a the gates can move", min(lr_sums) if lr_sums else None, 1.5, "learning rates sum >= 1.5"),
            _check("3b the gates move", max(moves) if moves else None, 0.05, "a GPSA layer's mean gate moves >= 0.05"),
            _check_trained(runs("deit", 1.0), runs("convit", 1.0))]


def _check_trained(deit_full: list[dict], convit_full: list[dict]) -> dict:
    """Pre-condition 4: FAILED as soon as one f = 1 run gained >= 2 points over its last quarter; passed only
    once both models have such a curve (one model alone could hide a climbing other)."""
    rise = lambda r: r["val_curve"][-1][1] - r["val_curve"][-1 - len(r["val_curve"]) // 4][1]
    curves = [[rise(r) for r in runs if len(r.get("val_curve", ())) >= 4] for runs in (deit_full, convit_full)]
    rises = curves[0] + curves[1]
    check = _check("4 f = 1 is trained", max(rises) if rises else None, 2, "f = 1, last quarter: < 2 points",
                   above=False)
    if check["passed"] and not all(curves):
        check["passed"] = None
    return check


def format_preconditions(checks: list[dict]) -> str:
    """One line per pre-condition: passed, FAILED or not checked, its value and what it needs."""
    verdict = {True: "passed", False: "FAILED", None: "not checked"}
    return "\n".join(f"{c['name']:<24}{verdict[c['passed']]:<12}"
                     f"{'' if c['value'] is None else format(c['value'], '.2f'):>7}   needs {c['needs']}"
                     for c in checks)


# %% [markdown]
# On made-up records: a design where data is scarce, attention matters and the gates move, but whose f = 1
# runs were stopped while still climbing (4 fails), and whose frozen-GPSA run is missing (2 is not checked).

# %%
def made_up(model, f, top1, **more):
    return {"model": model, "fraction": f, "ablation": None, "seed": 0, "val_top1": top1, "lr_sum": 1.86,
            "gates_start": [0.73] * 4, "gates_end": [0.73, 0.70, 0.64, 0.60], **more}


made = [made_up("deit", 0.1, 31.0), made_up("convit", 0.1, 36.0),
        made_up("deit", 1.0, 55.0, val_curve=[[e, 30 + 2 * e] for e in range(1, 13)])]
checks = check_preconditions(made)
print(format_preconditions(checks))
assert [c["passed"] for c in checks] == [True, None, True, True, False]
made.append(made_up("convit", 0.1, 34.0, ablation="frozen_gpsa"))
assert check_preconditions(made)[1]["passed"] is False  # 36 - 34 = 2 points: attention barely matters

# %% [markdown]
# Pre-condition 4 is about *both* models: a DeiT at f = 1 that has levelled off says nothing about a ConViT at
# f = 1 that may still be climbing, so it passes only once both curves are there; one climbing curve fails it.

# %%
flat = lambda model: made_up(model, 1.0, 55.0, val_curve=[[e, 55 - 0.1 * (e % 2)] for e in range(1, 13)])
assert check_preconditions(made[:2] + [flat("deit")])[4]["passed"] is None  # the ConViT at f = 1 is missing
assert check_preconditions(made[:2] + [flat("deit"), flat("convit")])[4]["passed"] is True
assert check_preconditions(made[:2] + [flat("convit"), made[2]])[4]["passed"] is False  # the DeiT climbs

# %% [markdown]
# ## Table 2 as a picture
#
# Test top-1 against f (each seed a dot, the mean a line) and the relative gain with two standard errors, next
# to the paper's gaps.

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


def plot_table_3(records: list[dict], fraction: float, paper: dict[str, float] | None = None) -> Figure:
    """Table 3's paired rows on ``fraction``: each row minus the ConViT of its seeds, ± 2 paired standard errors,
    beside the paper's differences (``paper``: row name to points) where given."""
    rows = [r for r in table_3(records, fraction) if r["vs_convit"] is not None]
    fig = Figure(figsize=(7, 0.9 + 0.45 * len(rows)), dpi=80)
    ax = fig.subplots()
    ax.errorbar([r["vs_convit"] for r in rows], range(len(rows)), xerr=[2 * r["vs_convit_se"] for r in rows],
                fmt="o", capsize=3, label="this grid (± 2 paired SE)")
    known = [(paper[r["name"]], y) for y, r in enumerate(rows) if r["name"] in (paper or {})]
    if known:
        ax.plot(*zip(*known), "s", color="grey", label="paper")
    ax.axvline(0, color="black", linewidth=0.5)
    ax.set(yticks=list(range(len(rows))), yticklabels=[f"{r['table_ref']} {r['label']}" for r in rows],
           xlabel="test top-1 minus the ConViT's (points)", title=f"Table 3 at f = {fraction:g}")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig



# %%
def answers_record(model: str, fraction: float, seed: int, answers: torch.Tensor) -> dict:
    correct = "".join(map(str, answers.tolist()))
    return {"model": model, "ablation": None, "fraction": fraction, "seed": seed, "train_top1": 100.0,
            "test_correct": correct, "test_images": len(correct), "test_top1": 100 * answers.float().mean().item()}


more = both | (torch.arange(1500) < 600).long()  # f = 1: both models right on more images, and equal
grid = [answers_record(m, 0.1, s, a[s]) for s in range(4)
        for m, a in (("convit", convit_answers), ("deit", deit_answers))]
grid += [answers_record(m, 1.0, s, more[s]) for s in range(4) for m in ("convit", "deit")]
table = table_2(grid)
print(format_table_2(table))
assert [(row["fraction"], row["paired"], round(row["diff"], 6)) for row in table] == [(0.1, True, 2.0),
                                                                                      (1.0, True, 0.0)]
plot_table_2(grid, paper_gaps={f: relative_gain(c, d) for f, (d, c) in {0.05: (34.8, 47.8), 0.1: (48.0, 59.6),
                                                                        1.0: (79.9, 81.4)}.items()})

# %% [markdown]
# ## Exercises
#
# **1. McNemar's test by hand.** For one seed, a paired comparison only looks at the images on which the two
# models disagree: b images the ConViT alone gets right, c the DeiT alone. Without a real difference, each
# disagreement is a coin flip, and McNemar's statistic (b − c)² / (b + c) follows a χ² with one degree of
# freedom (beyond 3.84 at the 5 % level). Compute it for seed 0 of the made-up answers above (`text[0][0]`, the
# ConViT's string of "0"/"1", and `text[1][0]`, the DeiT's) and set `mcnemar`.

# %%
mcnemar = ...  # your answer: mcnemar = ...

# %%
from convit_edu.checks import grade, reveal


def check_mcnemar(answer: float) -> None:
    pairs = list(zip(text[0][0], text[1][0]))
    b, c = pairs.count(("1", "0")), pairs.count(("0", "1"))
    check_answer(abs(answer - (b - c) ** 2 / (b + c)) < 1e-6, "count only the disagreements: b where the ConViT "
                 "alone is right, c where the DeiT alone is; the images both get right or wrong do not enter")


grade("mcnemar", mcnemar, check_mcnemar)
print(expect_error(lambda: check_mcnemar((75 - 45) ** 2 / 1500), WrongAnswer))

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(mcnemar):  # a reference answer, run when CONVIT_EDU_SOLUTIONS (or CI) is set
    b = sum(c == "1" and d == "0" for c, d in zip(text[0][0], text[1][0]))
    c = sum(c == "0" and d == "1" for c, d in zip(text[0][0], text[1][0]))
    mcnemar = (b - c) ** 2 / (b + c)
    print(f"b = {b}, c = {c}: McNemar's statistic {mcnemar:.2f}, beyond 3.84: a difference at the 5 % level")
    grade("mcnemar", mcnemar, check_mcnemar)

# %% [markdown]
# **2. Pre-condition 1 on real pilots.** Chapter 39's pilots are committed: `results/pilots/grid12/summary.json`
# (f = 0.1) and `results/pilots/grid12-f1/summary.json` (f = 1), each a list of records. How many points of dev
# top-1 (`val_top1`) does the DeiT lose from f = 1 to f = 0.1? Set `data_scarcity`; is pre-condition 1 met?

# %%
data_scarcity = ...  # your answer: data_scarcity = ...

# %%
def check_data_scarcity(answer: float) -> None:
    pilot = [r for folder in ("grid12", "grid12-f1")
             for r in json.loads((Path("results/pilots") / folder / "summary.json").read_text())]
    (check,) = [c for c in check_preconditions(pilot) if c["name"].startswith("1 ")]
    check_answer(abs(answer - check["value"]) < 1e-6, "the DeiT's val_top1 at f = 1 minus its val_top1 at "
                 "f = 0.1 (the ConViT's records are not part of this pre-condition)")


grade("data_scarcity", data_scarcity, check_data_scarcity)

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(data_scarcity):  # a reference answer, run when CONVIT_EDU_SOLUTIONS (or CI) is set
    import json
    from pathlib import Path


    def dev_top1(folder: str, model: str) -> float:
        (record,) = [r for r in json.loads((Path("results/pilots") / folder / "summary.json").read_text())
                     if r["model"] == model and r["ablation"] is None]
        return record["val_top1"]


    data_scarcity = dev_top1("grid12-f1", "deit") - dev_top1("grid12", "deit")
    print(f"the DeiT loses {data_scarcity:.1f} points of dev top-1 from f = 1 to f = 0.1 (pre-condition 1: >= 10)")
    grade("data_scarcity", data_scarcity, check_data_scarcity)
    print(expect_error(lambda: check_data_scarcity(-data_scarcity), WrongAnswer))
