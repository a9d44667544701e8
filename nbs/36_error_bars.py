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
# # Comparing two models beyond noise: error bars that count the seeds and the test images
#
# A grid of runs (chapter 35's design) leaves one record per run: which model, which fraction f of the training
# images, which seed, and how it scored on each test image. Before chapter 36_tables turns records into the paper's
# Tables 2 and 3, this chapter asks the question the paper's single runs cannot: is a difference of a point or two
# between two models more than noise? Two kinds of noise move it. Train again with another **seed** and every run
# scores a little differently; and every run is scored on the same few thousand **test images**, a sample that may
# happen to suit one model. Counting both, with few seeds, is the chapter's subject: one rule, written down before
# the grid it judges ran, that every verdict of the lesson (chapter 38) follows.

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

# %%
import json
from pathlib import Path

from convit_edu.checks import check_answer, demonstrate, expect_error, grade, reveal

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
# **2. Welch's degrees of freedom.** For the made-up arms above, `runs_a` and `runs_b` (4 seeds each, a row of 0/1
# answers per run), compute from each run's top-1 (in %) the Satterthwaite ν of the rule's step 4, (v_A + v_B)² /
# (v_A²/(n_A − 1) + v_B²/(n_B − 1)) with v = s²/n, and set `welch_df`. Nearer the 3 of one arm or the 6 of both?

# %%
welch_df = ...  # your answer: welch_df = ...

# %%
def check_welch_df(answer: float) -> None:
    want = difference((100 * runs_a.mean(1)).tolist(), (100 * runs_b.mean(1)).tolist(), 0.0, 1500, None)["df"]
    check_answer(not math.isclose(answer, 6), "n_A + n_B − 2 = 6 is the pooled t's; Welch weighs each arm by its df")
    check_answer(not math.isclose(answer, want * 4 / 3, rel_tol=1e-6), "four seeds give n − 1 = 3 degrees of freedom")
    check_answer(math.isclose(answer, want, rel_tol=1e-6), "square v_A + v_B (v = s²/4), divide by v_A²/3 + v_B²/3")


grade("welch_df", welch_df, check_welch_df)
v = [statistics.variance((100 * runs.mean(1)).tolist()) / 4 for runs in (runs_a, runs_b)]
demonstrate(check_welch_df, {"n_A + n_B − 2": 6.0, "n, not n − 1": sum(v) ** 2 / (v[0] ** 2 / 4 + v[1] ** 2 / 4),
                             "the variances, not their squares": sum(v) / (v[0] / 3 + v[1] / 3)})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(welch_df):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    v_a, v_b = (statistics.variance((100 * runs.mean(1)).tolist()) / 4 for runs in (runs_a, runs_b))
    welch_df = (v_a + v_b) ** 2 / (v_a**2 / 3 + v_b**2 / 3)
    print(f"ν = {welch_df:.1f}: nearer {3 if welch_df < 4.5 else 6}")
    grade("welch_df", welch_df, check_welch_df)
