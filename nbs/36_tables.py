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
# A grid of runs (chapter 35's design) leaves one record per run: which model, which fraction f of the training
# images, which seed, and how it scored on each test image. This chapter turns records into the paper's Table 2
# (ConViT against DeiT on each fraction) and Table 3 (the ablations), and asks the question the paper's single runs
# cannot: is a difference of a point or two between two models more than noise? Two kinds of noise move it. Train
# again with another **seed** and every run scores a little differently; and every run is scored on the same few
# thousand **test images**, a sample that may happen to suit one model. Counting both, with few seeds, is the
# chapter's subject: one rule, written down before the grid it judges ran, that every verdict of the lesson
# (chapter 38) follows. Then the design's **pre-conditions**, checked by code on the dev images.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp tables
# From a grid's records to the paper's Tables 2 and 3: test top-1, error bars that count the seeds and the shared
# test images, the pre-conditions.

# %%
#| export
import math
import statistics

import torch
from matplotlib.figure import Figure

from convit_edu.experiment_design import ABLATIONS

# %%
# %matplotlib inline
import json
from pathlib import Path

from convit_edu.checks import check_answer, demonstrate, expect_error, grade, reveal

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
print(f"f = 5 %: {relative_gain(47.8, 34.8):.0f} %")
print(expect_error(lambda: relative_gain(50.0, 0.0)))

# %% [markdown]
# ## A run's score, image by image
#
# A run of the design is scored on a fixed **test split** (chapter 35): the same images for every model, fraction
# and seed, never trained or tuned on. Its record keeps `test_top1` and `test_correct`, one character per test image
# ("1" right, "0" wrong), so two runs can be compared image by image. (The first design, chapter 39, had no such
# split: a run was scored on every image it did not train on, `unseen_top1`, different images at different
# fractions.)

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


def answers(runs: list[dict]) -> torch.Tensor:
    """The runs' per-image test answers (``test_correct``) as a (runs, images) float64 tensor of 1 (right) and 0
    (wrong); ValueError unless there is a run and every run was scored on the same number of test images."""
    lengths = sorted({len(r["test_correct"]) for r in runs})
    if len(lengths) != 1:
        raise ValueError(f"need one run or more, all scored on the same test images: answer lengths {lengths}")
    return torch.tensor([[ch == "1" for ch in r["test_correct"]] for r in runs], dtype=torch.float64)

# %% [markdown]
# ## Two kinds of noise
#
# Call the two models compared A and B, each an **arm** of n_A and n_B runs (seeds), all scored on the same N test
# images. The question is the difference of the arms' mean test top-1, and how far it would move if the grid were
# run again with other seeds and scored on another N images of the same classes.
#
# * **The seeds.** A seed changes a run's initial weights, its crops and the order of its images: each run is one
#   draw, and so is which of the hard images it happens to get right. Over an arm's seeds the test top-1 spreads
#   by some standard deviation s (a few tenths of a point to a point in chapter 38's grid), and the mean of n runs
#   by s/√n. More seeds shrink this part.
# * **The images.** Every run is scored on the *same* N images. Some of them suit A better than B whatever the
#   seed: that per-image difference, shared by every seed, has a variance σ_b² over images, and its mean over N
#   images varies by σ_b²/N. More seeds do not shrink this part; more test images do.
#
# Together, for the difference of the two arms' means:
#
# $$\mathrm{SE}_{total} = \sqrt{\frac{s_A^2}{n_A} + \frac{s_B^2}{n_B} + \frac{\sigma_b^2}{N}}.$$

# %% [markdown]
# ### Comparing image by image
#
# Both parts are smaller than two separate error bars suggest, because both models answer the *same* images. One
# run of each on 1 500 test images: they agree on most (both get the easy ones right and the hard ones wrong) and
# differ on a few; here the ConViT alone gets 75 right, the DeiT alone 45, so the ConViT leads by 2 points.
# Scored separately, each top-1 has a binomial noise of about √(0.5 · 0.5 / 1 500) ≈ 1.3 points and their difference
# √2 times that, 1.8 points: 2 points would look like noise. Compared image by image, only the 120 images on which
# they disagree carry noise: the per-image difference is +1, −1 or 0, its variance about 120 / 1 500, and the
# standard error of its mean √120 / 1 500 ≈ 0.73 point.

# %%
g = torch.Generator().manual_seed(0)
both = (torch.rand(1500, generator=g) < 0.5).long()  # the images both get right
convit_run, deit_run = both.clone(), both.clone()
convit_run[:75], deit_run[:75] = 1, 0  # the ConViT alone gets these right
convit_run[75:120], deit_run[75:120] = 0, 1  # the DeiT alone these
convit_text, deit_text = ("".join(map(str, run.tolist())) for run in (convit_run, deit_run))
p_c, p_d = convit_run.double().mean().item(), deit_run.double().mean().item()
separately = 100 * math.sqrt((p_c * (1 - p_c) + p_d * (1 - p_d)) / 1500)
by_image = 100 * ((convit_run - deit_run).double().std() / math.sqrt(1500)).item()
print(f"ConViT − DeiT = {100 * (p_c - p_d):+.1f} points; standard error scored separately {separately:.1f}, "
      f"image by image {by_image:.2f}")
assert by_image < separately / 2

# %% [markdown]
# With several seeds, the per-image difference of one run pair still mixes two things: what every seed of the two
# models would do on that image, and this pair's own luck on it. Only the first is shared by all seeds, and only it
# stays when the seeds are averaged: σ_b².
#
# ### The images' part: σ_b² from covariances over images
#
# What every seed of an arm shares is what two of its runs have in common image by image: their covariance over
# the test images. So σ_b², the shared variance of A − B per image, is the mean of cov(A_s, A_s′) + cov(B_t, B_t′)
# − 2 cov(A_s, B_t) over distinct runs s ≠ s′, t ≠ t′ (all pairs s, t for the cross term), clipped at 0. A run's
# covariance with *itself*, its variance, would also count its seed's own luck on each image, which the seeds'
# part already holds. An arm of a single run has no second run to share with: it takes its class set's pooled
# value (below).

# %%
#| export
def _covariances(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Covariance over images (divided by images − 1) of every row of ``x`` with every row of ``y``."""
    x, y = x - x.mean(1, keepdim=True), y - y.mean(1, keepdim=True)
    return x @ y.T / (x.shape[1] - 1)


def within_covariance(runs: torch.Tensor) -> float:
    """The mean covariance over images between two distinct runs of one arm (rows of ``runs``, from ``answers``):
    the per-image variance that every seed of the arm shares."""
    n = runs.shape[0]
    if n < 2:
        raise ValueError(f"the variance an arm's seeds share needs two runs or more, got {n}")
    c = _covariances(runs, runs)
    return ((c.sum() - c.diagonal().sum()) / (n * (n - 1))).item()


def shared_variance(a: torch.Tensor, b: torch.Tensor, pooled_within: float | None = None) -> float:
    """σ_b², the per-image variance of A − B that every seed sees on the same test images: the mean of
    cov(A_s, A_s′) + cov(B_t, B_t′) − 2 cov(A_s, B_t) over distinct runs, clipped at 0 (on the 0/1 scale of
    ``answers``). An arm of one run takes ``pooled_within`` (``run_spread``'s ``within``) for its own term."""
    terms = []
    for runs in (a, b):
        if runs.shape[0] > 1:
            terms.append(within_covariance(runs))
        elif pooled_within is None:
            raise ValueError("an arm of one run needs its class set's pooled within-arm covariance (run_spread)")
        else:
            terms.append(pooled_within)
    return max(0.0, terms[0] + terms[1] - 2 * _covariances(a, b).mean().item())

# %% [markdown]
# Checked on made-up answers where σ_b² is known. 1 500 images; for each image two "true" chances of being right,
# one per arm, drawn once and shared by every seed; each run draws its answers from its arm's chances. The shared
# per-image variance of A − B is then the variance over images of the difference of the chances:

# %%
g = torch.Generator().manual_seed(0)
images = 2 * torch.randn(1500, generator=g, dtype=torch.float64)  # how hard each image is, on a logit scale
chance_a = torch.sigmoid(images + 0.8 * torch.randn(1500, generator=g, dtype=torch.float64) + 0.1)  # A, a little
chance_b = torch.sigmoid(images + 0.8 * torch.randn(1500, generator=g, dtype=torch.float64))  # better than B
runs_a, runs_b = (torch.bernoulli(p.expand(4, 1500), generator=g) for p in (chance_a, chance_b))  # 4 seeds each
truth = (chance_a - chance_b).var().item()
one_pair = (runs_a[0] - runs_b[0]).var().item()  # one run of each: its seed's own luck counted as shared
print(f"σ_b² known {truth:.3f}, estimated from 4 + 4 runs {shared_variance(runs_a, runs_b):.3f}; the variance of "
      f"one run pair's per-image difference {one_pair:.2f}")
assert abs(shared_variance(runs_a, runs_b) - truth) < 0.01 and truth < one_pair / 5

# %% [markdown]
# On these made-up runs, most of the per-image variance of a single run pair is that pair's own luck; what every
# seed shares is about a ninth of it. (Chapter 38's grids are much the same: below.)
#
# ### The seeds' part: each arm's spread, pooled where an arm has few seeds
#
# s_A is the standard deviation of A's test top-1 over its seeds. With two seeds it rests on a single difference
# (one degree of freedom) and is often far off. Drawn from a normal of standard deviation 1, two values give a
# sample SD below ½ in more than a third of draws, and above 1.4 in a sixth:

# %%
pairs = torch.randn(100_000, 2, generator=torch.Generator().manual_seed(1))
two_seed_sd = pairs.std(dim=1)  # the sample SD (n − 1) of two values; the true SD is 1
below, above = (two_seed_sd < 0.5).float().mean().item(), (two_seed_sd > 1.4).float().mean().item()
print(f"two values of SD 1: sample SD below 0.5 in {below:.0%} of draws, above 1.4 in {above:.0%}")
assert abs(below - 0.383) < 0.01 and abs(above - 0.162) < 0.01  # P(|Z| < 0.5), P(|Z| > 1.4) for a standard normal

# %% [markdown]
# So an arm with **fewer than three seeds** takes its class set's **pooled** run-to-run SD instead: the variances of
# every arm of that class set with at least two seeds, weighted by their degrees of freedom (n − 1 each), as one
# estimate with their summed degrees of freedom. The same arms give the pooled within-arm covariance an arm of one
# run needs for σ_b². A class set is one set of classes, its test images and every run scored on them: the
# runs of one results folder.

# %%
#| export
def _arms(records: list[dict]) -> dict[tuple[str, float], list[dict]]:
    """The records by arm: (ablation, or the model when there is none, fraction)."""
    arms: dict[tuple[str, float], list[dict]] = {}
    for r in records:
        arms.setdefault((r["ablation"] or r["model"], r["fraction"]), []).append(r)
    return arms


def run_spread(records: list[dict]) -> dict | None:
    """A class set's pooled run-to-run spread, from its arms with two seeds or more (None when there are none):
    ``sd`` (points of test top-1, df-weighted over the arms), ``df``, ``within`` (their df-weighted
    ``within_covariance``, None for runs without per-image answers) and ``arms``."""
    arms = {key: runs for key, runs in _arms(records).items() if len(runs) >= 2}
    if not arms:
        return None
    df = sum(len(runs) - 1 for runs in arms.values())
    variance = sum((len(runs) - 1) * statistics.variance(map(test_top1, runs)) for runs in arms.values()) / df
    within = None
    if all("test_correct" in r for runs in arms.values() for r in runs):
        within = sum((len(runs) - 1) * within_covariance(answers(runs)) for runs in arms.values()) / df
    return {"sd": math.sqrt(variance), "df": df, "within": within, "arms": sorted(arms)}

# %% [markdown]
# ### The rule
#
# Written down before the classes-20-39 grid ran (`results/classes-20-39/README.md`), and what every comparison
# of the course follows. For A − B on one class set:
#
# 1. **All seeds of each arm.** diff = the mean test top-1 of A's runs − the mean of B's. The seed does *not* pair
#    runs: a ConViT and a DeiT of one seed start from the same random numbers, not from the same luck (below).
# 2. **SE_total** = √(s_A²/n_A + s_B²/n_B + σ_b²/N), each arm with its own SD from three seeds on, else the pooled
#    one (reported as pooled).
# 3. **Verdict**: "larger" when diff > 2 SE_total, "smaller" when diff < −2 SE_total, otherwise "within noise".
# 4. **Beside it**: the seed-level **Welch t**, diff / √(s_A²/n_A + s_B²/n_B) (the seeds' part alone), with its
#    Satterthwaite degrees of freedom (ν = (Σ v)² / Σ (v²/df), one v per independent variance estimate, the pooled
#    SD counting once), and the **seed-paired differences** (A − B of the same seed) that tables of one pair per seed
#    report.
#
# An arm of two seeds has one degree of freedom: the t distribution then has heavy tails, and t must reach 12.7 for
# a two-sided 5 % (3.18 on 3 df, 2.23 on 10). `t_p_value` integrates its density; the cell after it checks it
# against those printed tables.

# %%
#| export
def verdict(diff: float, se: float) -> str:
    """The rule's word for a difference with its standard error: beyond two of them, or within noise."""
    return "larger" if diff > 2 * se else "smaller" if diff < -2 * se else "within noise"


def t_p_value(t: float, df: float) -> float:
    """Two-sided p-value of Student's t with ``df`` (≥ 1) degrees of freedom, 2 P(T > |t|): its density integrated
    by Simpson's rule over x = tan θ, from θ = atan |t| to π/2 (where the integrand is 0, or 1/π for df = 1)."""
    if not df >= 1:
        raise ValueError(f"degrees of freedom {df} must be >= 1")
    start = math.atan(abs(t))
    theta = torch.linspace(start, math.pi / 2, 4001, dtype=torch.float64)[:-1]
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    density = torch.exp(log_c - (df + 1) / 2 * torch.log1p(torch.tan(theta) ** 2 / df)) / torch.cos(theta) ** 2
    density = torch.cat([density, torch.tensor([math.exp(log_c) if df == 1 else 0.0], dtype=torch.float64)])
    weights = torch.ones(4001, dtype=torch.float64)
    weights[1:-1:2], weights[2:-1:2] = 4, 2
    return min(1.0, 2 * (math.pi / 2 - start) / 4000 / 3 * float(weights @ density))


# %%
for df, t in ((1, 12.706), (3, 3.182), (10, 2.228)):  # two-sided 5 % points of Student's t, as tables print them
    print(f"t = {t} on {df} df: p = {t_p_value(t, df):.3f}")
    assert abs(t_p_value(t, df) - 0.05) < 1e-3
print(expect_error(lambda: t_p_value(2.0, 0.5)))

# %% [markdown]
# `difference` puts the rule together from each arm's run scores, the shared variance and the number of test images:

# %%
#| export
def _arm_variance(top1: list[float], spread: dict | None, name: str) -> tuple[float, int, str] | None:
    """(s², df, source) of one arm's test top-1: its own from three seeds on, else the class set's pooled one."""
    if len(top1) >= 3:
        return statistics.variance(top1), len(top1) - 1, name
    return None if spread is None else (spread["sd"] ** 2, spread["df"], "pooled")


def difference(a: list[float], b: list[float], shared: float | None, images: int, spread: dict | None) -> dict:
    """The rule's A − B from the arms' run scores ``a`` and ``b`` (top-1 in %, one per seed), the shared per-image
    variance ``shared`` (σ_b², 0/1 scale) and the number of test ``images``: ``diff``, ``se`` (SE_total), ``z``,
    ``verdict``, each arm's ``sd`` and whether it is ``pooled`` (from ``spread``, ``run_spread``'s), and the
    seed-level Welch ``t``, its Satterthwaite ``df`` and ``p``. ``se`` and what follows from it are None when an
    arm has fewer than three seeds and no ``spread`` is known."""
    arms = [_arm_variance(top1, spread, name) for top1, name in ((a, "a"), (b, "b"))]
    diff = statistics.fmean(a) - statistics.fmean(b)
    out = {"diff": diff, "n": (len(a), len(b)), "images": images, "shared": shared,
           "sd": tuple(None if v is None else math.sqrt(v[0]) for v in arms),
           "pooled": tuple(v is not None and v[2] == "pooled" for v in arms),
           "se": None, "z": None, "verdict": None, "t": None, "df": None, "p": None}
    if None in arms or shared is None:
        return out
    means: dict[str, tuple[float, int]] = {}  # the variance of each arm's mean, by the estimate it rests on
    for (s2, df, source), n in zip(arms, out["n"]):
        means[source] = (means.get(source, (0.0, df))[0] + s2 / n, df)  # the pooled SD counts once
    seeds = sum(v for v, _ in means.values())
    se = math.sqrt(seeds + 1e4 * shared / images)
    out.update(se=se, z=diff / se if se > 0 else math.nan, verdict=verdict(diff, se))
    if seeds > 0:
        t, df = diff / math.sqrt(seeds), seeds**2 / sum(v**2 / d for v, d in means.values())
        out.update(t=t, df=df, p=t_p_value(t, df))
    return out

# %% [markdown]
# `compare` applies it to two arms' records, and adds what stands beside the verdict: the seed-paired differences,
# and the images' part alone (`se_images`, the per-image difference of the arms' mean answers, seeds held fixed),
# which is all an arm of one seed can give when no second seed of anything was run. Then "within noise" is
# still a verdict (counting the seeds could only widen the error), a difference beyond it is "not decided".

# %%
#| export
def _seed_paired(a: list[dict], b: list[dict]) -> dict:
    """A − B of each seed both arms ran, their mean and, from two seeds on, the paired t on n − 1 df."""
    top_a, top_b = ({r["seed"]: test_top1(r) for r in runs} for runs in (a, b))
    seeds = sorted(top_a.keys() & top_b.keys())
    diffs = [top_a[s] - top_b[s] for s in seeds]
    out = {"seeds": seeds, "diffs": diffs, "mean": statistics.fmean(diffs) if diffs else None, "t": None, "df": None,
           "p": None}
    if len(diffs) >= 2 and statistics.stdev(diffs) > 0:
        t = out["mean"] / (statistics.stdev(diffs) / math.sqrt(len(diffs)))
        out.update(t=t, df=len(diffs) - 1, p=t_p_value(t, len(diffs) - 1))
    return out


def compare(a: list[dict], b: list[dict], spread: dict | None) -> dict:
    """A − B by the rule, ``a`` and ``b`` the records of two arms scored on the same test images: ``difference``
    over all seeds of each arm, σ_b² from their ``answers`` (``shared_variance``), the class set's ``spread``
    (``run_spread``) for an arm of fewer than three seeds; beside it ``paired`` (the seed-paired differences) and
    ``se_images``. Without a spread an arm of one seed is judged on the images alone: ``basis`` says which."""
    x, y = answers(a), answers(b)
    if x.shape[1] != y.shape[1]:
        raise ValueError(f"the two arms were scored on {x.shape[1]} and {y.shape[1]} test images: not the same ones")
    within = None if spread is None else spread["within"]
    shared = shared_variance(x, y, within) if min(len(x), len(y)) > 1 or within is not None else None
    out = difference((100 * x.mean(1)).tolist(), (100 * y.mean(1)).tolist(), shared, x.shape[1], spread)
    se_images = 100 * math.sqrt((x.mean(0) - y.mean(0)).var().item() / x.shape[1])
    out.update(paired=_seed_paired(a, b), se_images=se_images, basis="seeds and images",
               spread=None if spread is None else (spread["sd"], spread["df"]))
    if out["se"] is None:
        out.update(basis="images only", verdict="within noise" if abs(out["diff"]) <= 2 * se_images
                   else "not decided")
    return out

# %% [markdown]
# Does SE_total measure what it claims, how far the difference moves when the grid is run again? Here 200 made-up
# grids, each with its own 1 500 test images (new chances per image) and its own 4 + 4 seeds, as above. Over the
# grids the difference spreads by about the SE_total each grid computes for itself, and about 95 % of the grids
# land within two of their own SE_total of the mean difference:

# %%
G = 200
g = torch.Generator().manual_seed(2)
hardness = 2 * torch.randn(G, 1, 1500, generator=g, dtype=torch.float64)
chances = [torch.sigmoid(hardness + 0.8 * torch.randn(G, 1, 1500, generator=g, dtype=torch.float64) + shift)
           for shift in (0.1, 0.0)]
grid_a, grid_b = (torch.bernoulli(p.expand(G, 4, 1500), generator=g) for p in chances)
results = [difference((100 * grid_a[k].mean(1)).tolist(), (100 * grid_b[k].mean(1)).tolist(),
                      shared_variance(grid_a[k], grid_b[k]), 1500, None) for k in range(G)]
diffs, ses = (torch.tensor([r[key] for r in results]) for key in ("diff", "se"))
ratio = (diffs.std() / ses.pow(2).mean().sqrt()).item()
covered = ((diffs - diffs.mean()).abs() < 2 * ses).float().mean().item()
print(f"spread of the difference over {G} grids / their SE_total: {ratio:.1f}; within 2 SE_total: {covered:.0%}")
assert 0.85 < ratio < 1.15 and 0.9 < covered < 0.99

# %% [markdown]
# ### The seed does not pair runs
#
# A ConViT and a DeiT of the same seed start from the same random numbers, but their architectures turn them into
# unrelated initial weights, and nothing makes the two runs' luck alike. On chapter 38's grids their test
# top-1s over the four seeds are even *negatively* correlated in all three Table 2 cells, so the per-seed
# differences spread more than two independent runs would, and pairing by seed would only choose which runs
# happen to be subtracted. The rule therefore compares all seeds of each arm, and reports the seed-paired
# differences beside it. (The cell also prints each cell's σ_b², the part of a run pair's per-image variance that
# every seed shares: a sixth or less, as in the made-up runs above.)

# %%
for folder, f in (("second-design", 0.1), ("second-design", 1.0), ("other-classes", 0.1)):
    cell = [r for r in json.loads(Path(f"results/{folder}/summary.json").read_text())
            if r["ablation"] is None and r["fraction"] == f]
    top = {m: torch.tensor([test_top1(r) for r in sorted(cell, key=lambda r: r["seed"]) if r["model"] == m],
                           dtype=torch.float64) for m in ("convit", "deit")}
    r = torch.corrcoef(torch.stack([top["convit"], top["deit"]]))[0, 1].item()
    unpaired = (top["convit"].var() + top["deit"].var()).sqrt().item()
    runs = {m: answers(sorted((x for x in cell if x["model"] == m), key=lambda x: x["seed"])) for m in top}
    shared, pair = shared_variance(runs["convit"], runs["deit"]), (runs["convit"] - runs["deit"]).var(1).mean().item()
    print(f"{folder}, f = {f:g}: r = {r:+.2f}; SD of the seed-paired differences "
          f"{(top['convit'] - top['deit']).std().item():.2f} points, of two unpaired runs {unpaired:.2f}; σ_b² "
          f"{shared:.3f}, {shared / pair:.0%} of a run pair's per-image variance")
    assert r < 0 and (top["convit"] - top["deit"]).std() > unpaired and shared < pair / 6

# %% [markdown]
# ### Many class sets: one difference, weighted by their test images
#
# Sets of classes that share no class, image or run are independent measurements of one question. Weighted by their
# test images, every class counts once: D = Σ w_k D_k with w_k = N_k / Σ N, and SE = √(Σ w_k² SE_k²). For the three
# registered sets (1 500, 1 500 and 3 000 test images) that is D₄₀ = (D₀₋₉ + D₁₀₋₁₉ + 2 D₂₀₋₃₉)/4 and
# SE₄₀ = √(SE₀₋₉² + SE₁₀₋₁₉² + 4 SE₂₀₋₃₉²)/4, judged by the same rule.

# %%
#| export
def pool_class_sets(parts: list[dict]) -> dict:
    """Independent class sets' ``compare`` results (``diff``, ``se``, ``images``) as one difference, each weighted
    by its test images (every class counts once): ``diff`` = Σ w D, ``se`` = √(Σ w² SE²), ``z``, ``verdict``."""
    if not parts or any(p["se"] is None for p in parts):
        raise ValueError("every class set needs its SE_total (an arm of one seed, without a pooled spread, has none)")
    total = sum(p["images"] for p in parts)
    weights = [p["images"] / total for p in parts]
    diff = sum(w * p["diff"] for w, p in zip(weights, parts))
    se = math.sqrt(sum((w * p["se"]) ** 2 for w, p in zip(weights, parts)))
    return {"diff": diff, "se": se, "z": diff / se, "verdict": verdict(diff, se), "images": total, "sets": len(parts)}


# %%
made_up_sets = [{"diff": -0.3, "se": 0.7, "images": 1500}, {"diff": 2.6, "se": 0.8, "images": 1500},
                {"diff": 1.0, "se": 0.6, "images": 3000}]
forty = pool_class_sets(made_up_sets)
print(f"D = {forty['diff']:+.3f} ± {forty['se']:.3f}: {forty['verdict']}")
assert math.isclose(forty["diff"], (-0.3 + 2.6 + 2 * 1.0) / 4)
assert math.isclose(forty["se"], math.sqrt(0.7**2 + 0.8**2 + 4 * 0.6**2) / 4)
print(expect_error(lambda: pool_class_sets([{"diff": 1.3, "se": None, "images": 1500}])))

# %% [markdown]
# ## Tables 2 and 3
#
# `table_2` gives one row per fraction with a ConViT and a DeiT: each arm's mean test top-1, the difference by the
# rule (over the records' whole class set for the pooled spread) and the relative gain with its standard error,
# 100 · SE_total / DeiT (the DeiT's own error neglected, small beside the difference's). `table_3` gives each
# ablation of one fraction against the ConViT, in the paper's row order, by the same rule. The first design's
# records (chapter 39), without per-image answers, keep the rule they were read with: each seed's ConViT minus its
# DeiT, the spread of those differences and the binomial noise of each score combined.

# %%
#| export
def _images(record: dict) -> int:
    return record["val_images"] + record["heldout_images"]


def _mean_se(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    return mean, statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")


def _seed_and_binomial(pairs: list[tuple[dict, dict]]) -> dict[str, float]:
    """The first design's uncertainty (no per-image answers, each seed's pair): top-1 on each run's unseen
    images, seed-to-seed spread and binomial noise combined."""
    accs = [(unseen_top1(c), unseen_top1(d)) for c, d in pairs]
    binomial = sum(p * (100 - p) / _images(r) for (c, d), pair in zip(accs, pairs)
                   for p, r in zip((c, d), pair)) ** 0.5 / len(pairs)  # in points
    diff, diff_se = _mean_se([c - d for c, d in accs])
    gain, gain_se = _mean_se([relative_gain(c, d) for c, d in accs])
    deit = sum(d for _, d in accs) / len(accs)
    return {"convit_top1": sum(c for c, _ in accs) / len(accs), "deit_top1": deit, "diff": diff,
            "diff_se": math.hypot(0.0 if math.isnan(diff_se) else diff_se, binomial), "gain": gain,
            "gain_se": math.hypot(0.0 if math.isnan(gain_se) else gain_se, 100 * binomial / deit)}


def _by_rule(a: list[dict], b: list[dict], spread: dict | None) -> dict:
    """``compare``'s result with Table 2's names: both arms' mean top-1, ``diff`` ± ``diff_se``, ``gain``."""
    c = compare(a, b, spread)
    top_a, top_b = (statistics.fmean(map(test_top1, runs)) for runs in (a, b))
    return {"convit_top1": top_a, "deit_top1": top_b, "diff": c["diff"], "diff_se": c["se"],
            "gain": relative_gain(top_a, top_b), "gain_se": None if c["se"] is None else 100 * c["se"] / top_b,
            "comparison": c}


def table_2(records: list[dict]) -> list[dict]:
    """One row per fraction with a ConViT and a DeiT: ``fraction``, ``seeds``, ``paired_seeds`` (those both ran),
    ``paired`` (scored on the same test images), ``test_images``, mean ``convit_top1`` and ``deit_top1``, ``diff``
    ± ``diff_se`` (points), ``gain`` ± ``gain_se`` (%), ``train_top1``; by the rule (``compare``, all seeds,
    ``comparison``) when every run saved its per-image answers, else ``_seed_and_binomial``."""
    plain = [r for r in records if r["ablation"] is None]
    spread = run_spread(records) if all("test_correct" in r for r in records) else None
    rows = []
    for f in sorted({r["fraction"] for r in plain}):
        arms = {m: [r for r in plain if r["model"] == m and r["fraction"] == f] for m in ("convit", "deit")}
        seeds = sorted({r["seed"] for r in arms["convit"]} & {r["seed"] for r in arms["deit"]})
        paired = all("test_correct" in r for r in arms["convit"] + arms["deit"])
        if not (seeds if not paired else arms["convit"] and arms["deit"]):
            continue
        if paired:
            stats = _by_rule(arms["convit"], arms["deit"], spread)
        else:
            by_seed = {m: {r["seed"]: r for r in runs} for m, runs in arms.items()}
            stats = _seed_and_binomial([(by_seed["convit"][s], by_seed["deit"][s]) for s in seeds])
            arms = {m: [by_seed[m][s] for s in seeds] for m in arms}
        rows.append({"fraction": f, "seeds": len({r["seed"] for runs in arms.values() for r in runs}),
                     "paired_seeds": seeds, "paired": paired,
                     "test_images": arms["convit"][0]["test_images"] if paired else _images(arms["convit"][0]),
                     **stats, "train_top1": {m: statistics.fmean(r["train_top1"] for r in runs)
                                             for m, runs in arms.items()}})
    return rows


def _rule_columns(c: dict) -> str:
    """A comparison's verdict, seed-level Welch t and seed-paired mean, for one line of a table."""
    if c["se"] is None:
        return f"{c['verdict']:<13}(± {c['se_images']:.1f} from the images alone)"
    welch = "" if c["t"] is None else f"t {c['t']:+5.1f} ({c['df']:4.1f} df, p {c['p']:.3f})"
    paired = c["paired"]
    if paired["mean"] is not None:
        welch += f"   seed-paired {paired['mean']:+5.1f}"
        welch += f" (t {paired['t']:+.1f}, {paired['df']} df, p {paired['p']:.2f})" if paired["t"] is not None else \
            f" (seed{'s' * (len(paired['seeds']) > 1)} {', '.join(map(str, paired['seeds']))})"
    return f"{c['verdict']:<13}{welch}"


def _legend(comparisons: list[dict]) -> list[str]:
    """What the rule's columns mean, the pooled spread where an arm used it, and what an arm of one seed gives."""
    lines = []
    if any(c["se"] is not None for c in comparisons):
        lines.append("all seeds of each arm; ± SE_total = sqrt(s_A^2/n_A + s_B^2/n_B + sigma_b^2/N), verdict at 2 "
                     "SE_total; Welch t: the seeds' part alone (Satterthwaite df); seed-paired: A - B of one seed")
    pooled = [c for c in comparisons if any(c["pooled"])]
    if pooled:
        lines.append(f"* an arm of fewer than 3 seeds takes this class set's pooled run-to-run SD, "
                     f"{pooled[0]['spread'][0]:.2f} points ({pooled[0]['spread'][1]} df)")
    if any(c["se"] is None for c in comparisons):
        lines.append("one seed an arm and no second seed in the class set: no run-to-run spread is measured; "
                     "within noise of the images alone stands (the seeds could only widen it)")
    return lines


def _plus_minus(c: dict | None, diff: float, se: float | None) -> str:
    mark = "*" if c is not None and any(c["pooled"]) else " "
    return f"{diff:>+6.1f} ± {'n/a' if se is None else format(se, '.1f'):<4}pt{mark}"


def format_table_2(rows: list[dict]) -> str:
    """Table 2's layout with the standard errors: f | seeds | images | DeiT, ConViT (test top-1) | difference |
    relative gap, and for rows by the rule its verdict, Welch t and seed-paired mean (a legend below)."""
    lines = [f"{'f':>6} {'seeds':>5} {'images':>6} | {'DeiT':>6} {'ConViT':>6} | {'ConViT - DeiT':>14} | "
             f"{'gap (relative)':>15} |" + " verdict" * any(r.get("comparison") for r in rows)]
    for r in rows:
        c = r.get("comparison")
        gain = "" if r["gain_se"] is None else f" ± {r['gain_se']:<3.0f}"
        lines.append(f"{r['fraction']:>6.0%} {r['seeds']:>5} {r['test_images']:>6} | {r['deit_top1']:>6.1f} "
                     f"{r['convit_top1']:>6.1f} | {_plus_minus(c, r['diff'], r['diff_se'])}| "
                     f"{r['gain']:>+6.0f}{gain:<6}% |" + ("" if c is None else " " + _rule_columns(c)))
    return "\n".join(lines + _legend([r["comparison"] for r in rows if r.get("comparison")]))


def table_3(records: list[dict], fraction: float) -> list[dict]:
    """The ablations on ``fraction`` in ``ABLATIONS`` order: name, Table 3 row, label, seeds, mean test and val
    top-1, and ``vs_convit`` ± ``vs_convit_se`` with its ``verdict``: the row minus the ConViT by the rule
    (``compare``, all seeds of both, ``comparison``); None for the ConViT or where runs saved no per-image answers."""
    spread = run_spread(records) if all("test_correct" in r for r in records) else None
    cells = {name: [r for r in records if r["fraction"] == fraction and r["model"] == a.model
                    and r["ablation"] == (None if name in ("convit", "deit") else name)]
             for name, a in ABLATIONS.items()}
    rows = []
    for name, runs in cells.items():
        if not runs:
            continue
        c = None
        if name != "convit" and cells["convit"] and all("test_correct" in r for r in runs + cells["convit"]):
            c = compare(runs, cells["convit"], spread)
        a = ABLATIONS[name]
        rows.append({"name": name, "table_ref": a.table_ref, "label": a.label, "seeds": len(runs),
                     "test_top1": statistics.fmean(map(test_top1, runs)),
                     "val_top1": statistics.fmean(r["val_top1"] for r in runs),
                     "vs_convit": c and c["diff"], "vs_convit_se": c and c["se"], "verdict": c and c["verdict"],
                     "comparison": c})
    return rows


def format_table_3(rows: list[dict]) -> str:
    """Table 3's rows with their test and dev top-1 and, by the rule, the difference to the ConViT, its verdict,
    Welch t and seed-paired mean (a legend below)."""
    lines = [f"{'row':<7}{'run':<27}{'seeds':>5}{'test top-1':>11}{'val top-1':>10}   vs ConViT      verdict"]
    for r in rows:
        c = r["comparison"]
        rule = "" if c is None else f"   {_plus_minus(c, c['diff'], c['se'])} {_rule_columns(c)}"
        lines.append(f"{r['table_ref']:<7}{r['label']:<27}{r['seeds']:>5}{r['test_top1']:>11.1f}"
                     f"{r['val_top1']:>10.1f}{rule}")
    return "\n".join(lines + _legend([r["comparison"] for r in rows if r["comparison"]]))

# %% [markdown]
# On made-up records: the 4 + 4 seeds of arms A and B above as a ConViT and a DeiT at f = 0.1, at f = 1 the same
# runs with 300 more images right for both, and a frozen-GPSA ablation of two seeds, which takes the pooled SD:

# %%
def answers_record(model: str, fraction: float, seed: int, run: torch.Tensor, ablation: str | None = None) -> dict:
    correct = "".join(str(int(v)) for v in run.tolist())
    return {"model": model, "ablation": ablation, "fraction": fraction, "seed": seed, "train_top1": 100.0,
            "val_top1": 50.0, "test_correct": correct, "test_images": len(correct),
            "test_top1": 100 * correct.count("1") / len(correct)}


easier = torch.arange(1500) < 300  # f = 1: 300 more images right, for both models
made_grid = [answers_record(m, f, s, torch.where(easier, 1.0, runs[s]) if f == 1 else runs[s])
             for f in (0.1, 1.0) for s in range(4) for m, runs in (("convit", runs_a), ("deit", runs_b))]
made_grid += [answers_record("convit", 0.1, s, runs_b[s], "frozen_gpsa") for s in (0, 1)]
rows_2 = table_2(made_grid)
print(format_table_2(rows_2), "\n")
print(format_table_3(table_3(made_grid, 0.1)))
spread = run_spread(made_grid)
top = {m: [test_top1(r) for r in made_grid if r["model"] == m and r["ablation"] is None and r["fraction"] == 0.1]
       for m in ("convit", "deit")}
assert math.isclose(rows_2[0]["diff"], statistics.fmean(top["convit"]) - statistics.fmean(top["deit"]))
frozen = {r["name"]: r for r in table_3(made_grid, 0.1)}["frozen_gpsa"]["comparison"]
assert frozen["pooled"] == (True, False) and frozen["sd"][0] == spread["sd"] and spread["df"] == 3 + 3 + 3 + 3 + 1

# %% [markdown]
# ## Pre-conditions: is this a grid that *could* show the effect?
#
# A grid can fail to show the paper's effect because the effect is not there, or because the design gives it no
# chance. Chapter 35's design states four pre-conditions before any run; `check_preconditions` checks them on a
# grid's records, on the images training is scored on (the dev images, `val/`), never on the test images, so the
# design can be chosen and checked without looking at the result it is meant to test:
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
    """Chapter 35's four pre-conditions of a Table 2 grid, from its records' dev top-1 (``val_top1``) at the smallest
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
# to the paper's gaps; Table 3's rows against the ConViT, ± 2 SE_total, beside the paper's.

# %%
#| export
def plot_table_2(records: list[dict], paper_gaps: dict[float, float] | None = None) -> Figure:
    """Left: test top-1 against f (each seed a dot, the mean a line). Right: the relative gain of the ConViT ± 2
    of its standard errors (``table_2``; a row of one seed per arm, without one, as a cross), and the paper's
    (``paper_gaps``) for reference."""
    fig = Figure(figsize=(9, 3.2), dpi=80)
    acc, gains = fig.subplots(1, 2)
    for model, colour, label in (("deit", "C0", "DeiT"), ("convit", "C3", "ConViT")):
        runs = [r for r in records if r["ablation"] is None and r["model"] == model]
        fractions = sorted({r["fraction"] for r in runs})
        acc.plot([r["fraction"] for r in runs], [test_top1(r) for r in runs], ".", color=colour, alpha=0.5)
        acc.plot(fractions, [statistics.fmean(test_top1(r) for r in runs if r["fraction"] == f) for f in fractions],
                 "-", color=colour, label=label)
    rows = table_2(records)
    known = [r for r in rows if r["gain_se"] is not None]
    gains.errorbar([r["fraction"] for r in known], [r["gain"] for r in known],
                   yerr=[2 * r["gain_se"] for r in known], fmt="o-", color="C3", capsize=3, label="this grid (± 2 SE)")
    unknown = [r for r in rows if r["gain_se"] is None]
    if unknown:
        gains.plot([r["fraction"] for r in unknown], [r["gain"] for r in unknown], "x", color="C3",
                   label="one seed: no standard error")
    if paper_gaps:
        gains.plot(list(paper_gaps), list(paper_gaps.values()), "s:", color="grey", label="paper (ImageNet, S)")
    gains.axhline(0, color="black", linewidth=0.5)
    for ax in (acc, gains):
        ax.set_xscale("log")
        ax.set_xlabel("fraction of the training images f")
        ax.legend(fontsize=7)
    acc.set(ylabel="test top-1 (%)", title="top-1 on the test images")
    gains.set(ylabel="relative improvement (%)", title="ConViT over DeiT")
    fig.tight_layout()
    return fig


def plot_table_3(records: list[dict], fraction: float, paper: dict[str, float] | None = None) -> Figure:
    """Table 3's rows on ``fraction`` by the rule: each row minus the ConViT (all seeds of both), ± 2 SE_total,
    beside the paper's differences (``paper``: row name to points) where given."""
    rows = [r for r in table_3(records, fraction) if r["vs_convit_se"] is not None]
    fig = Figure(figsize=(7, 0.9 + 0.45 * len(rows)), dpi=80)
    ax = fig.subplots()
    ax.errorbar([r["vs_convit"] for r in rows], range(len(rows)), xerr=[2 * r["vs_convit_se"] for r in rows],
                fmt="o", capsize=3, label="this grid (± 2 SE, all seeds)")
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
plot_table_2(made_grid, paper_gaps={f: relative_gain(c, d) for f, (d, c) in {0.05: (34.8, 47.8), 0.1: (48.0, 59.6),
                                                                             1.0: (79.9, 81.4)}.items()})

# %% [markdown]
# ## Exercises
#
# **1. McNemar's test by hand.** For one pair of runs, a comparison image by image only looks at the images on
# which the two models disagree: b images the ConViT alone gets right, c the DeiT alone. Without a real difference,
# each disagreement is a coin flip, and McNemar's statistic (b − c)² / (b + c) follows a χ² with one degree of
# freedom (beyond 3.84 at the 5 % level). Compute it for the made-up pair above (`convit_text`, the ConViT's string
# of "0"/"1", and `deit_text`, the DeiT's) and set `mcnemar`.

# %%
mcnemar = ...  # your answer: mcnemar = ...

# %%
def check_mcnemar(answer: float) -> None:
    pairs = list(zip(convit_text, deit_text))
    b, c = pairs.count(("1", "0")), pairs.count(("0", "1"))
    check_answer(not math.isclose(answer, (b - c) / math.sqrt(b + c), rel_tol=1e-6), "that is the z form, "
                 "(b − c) / √(b + c), a standard normal without a difference; McNemar's statistic is its square")
    check_answer(abs(answer - (b - c) ** 2 / (b + c)) < 1e-6, "count only the disagreements: b where the ConViT "
                 "alone is right, c where the DeiT alone is; the images both get right or wrong do not enter")


grade("mcnemar", mcnemar, check_mcnemar)
demonstrate(check_mcnemar, {"the z form, not squared": (75 - 45) / math.sqrt(75 + 45),
                            "divided by all 1 500 images": (75 - 45) ** 2 / 1500})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(mcnemar):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    b = sum(c == "1" and d == "0" for c, d in zip(convit_text, deit_text))
    c = sum(c == "0" and d == "1" for c, d in zip(convit_text, deit_text))
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
    check_answer(not math.isclose(answer, -check["value"]), "the loss is f = 1 minus f = 0.1: a positive number")
    check_answer(abs(answer - check["value"]) < 1e-6, "the DeiT's val_top1 at f = 1 minus its val_top1 at "
                 "f = 0.1 (the ConViT's records are not part of this pre-condition)")


grade("data_scarcity", data_scarcity, check_data_scarcity)
demonstrate(check_data_scarcity, {"f = 0.1 minus f = 1": 45.6 - 58.8,  # the DeiT's dev top-1s in the two summaries
                                  "the ConViT's loss": 60.4 - 47.0})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(data_scarcity):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def dev_top1(folder: str, model: str) -> float:
        (record,) = [r for r in json.loads((Path("results/pilots") / folder / "summary.json").read_text())
                     if r["model"] == model and r["ablation"] is None]
        return record["val_top1"]


    data_scarcity = dev_top1("grid12-f1", "deit") - dev_top1("grid12", "deit")
    print(f"the DeiT loses {data_scarcity:.1f} points of dev top-1 from f = 1 to f = 0.1 (pre-condition 1: >= 10)")
    grade("data_scarcity", data_scarcity, check_data_scarcity)
