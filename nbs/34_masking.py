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
# # Masking at test time: what a trained model needs
#
# Chapter 34_attention_maps looked at *where* the heads of a trained DeiT and ConViT look. This chapter asks what
# the two trained models need: what their learned positional embedding encodes, then what masking it, or the
# content or positional attention of the GPSA layers, costs them at test time (SM F, Tables 5 and 6).

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp attention_maps

# %%
# %matplotlib inline
import math
from pathlib import Path

import torch

from convit_edu.attention_maps import load_run
from convit_edu.augment import build_transforms
from convit_edu.checks import check_answer, demonstrate, grade, reveal
from convit_edu.datasets import build_datasets
from convit_edu.evaluation import evaluate, format_masking, masking_table
from convit_edu.masking import mask_at_test_time
from convit_edu.photographs import tiny_imagenet
from convit_edu.zoo import create_model

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# The models are chapter 34_attention_maps' two runs of the first design (chapter 39) on all the data, loaded from
# their committed weights, and the images its 500 validation images, with the runs' own evaluation transform:

# %%
RESULTS = Path("results/sample-efficiency")  # the first design's committed runs (chapter 39)
RUNS = {"DeiT": "deit_f1_s0", "ConViT": "convit_f1_s0"}
TINY = tiny_imagenet("../data")  # the first 10 classes, as in chapter 33
_, _, classes = build_datasets("imagefolder", TINY, max_classes=10)
run_configs, loaded = {}, {}
for name, run in RUNS.items():
    run_configs[name], loaded[name] = load_run(RESULTS / run, len(classes))
_, run_val_tf = build_transforms(run_configs["ConViT"].aug_config())
_, val_set, _ = build_datasets("imagefolder", TINY, val_transform=run_val_tf, max_classes=10)

# %% [markdown]
# ### The learned positional embedding (Table 5 made concrete)
#
# Both models add a learned embedding `pos_embed` to every patch before the first block (the DeiT has one more slot,
# its class token's, left out here). What position does it encode? For each patch, the cosine similarity of its
# embedding with every other patch's, drawn as a small 8 × 8 map at that patch's place: an 8 × 8 grid of maps. An
# untrained embedding (random, σ = 0.02) has no structure, every map flat near 0; a learned one that codes position
# makes each patch most like its neighbours.

# %%
#| export
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from convit_edu.models import VisionTransformer


def position_similarity(model: VisionTransformer) -> Tensor:
    """Cosine similarity of every patch's learned position embedding (``pos_embed``, without the class token's
    slot) with every other patch's: (rows, cols, rows, cols), ``[r, c]`` the map of patch (r, c) (SM F, Table 5:
    what masking the positional embedding removes)."""
    rows, cols = model.config.grid_size
    unit = F.normalize(model.pos_embed[0, model.config.pos_embed_prefix_slots:].detach().float(), dim=-1)
    return (unit @ unit.T).reshape(rows, cols, rows, cols)


# %%
import matplotlib.pyplot as plt

from convit_edu.locality import patch_distances

torch.manual_seed(0)
untrained = create_model("deit_tiny", img_size=64, patch_size=8, embed_dim=72, num_heads=9, depth=6, num_classes=10)
similarity = {"untrained": position_similarity(untrained), **{name: position_similarity(m) for name, m in loaded.items()}}
fig, axes = plt.subplots(1, 3, figsize=(12, 4.2), dpi=80)
for ax, (name, sim) in zip(axes, similarity.items()):
    ax.imshow(rearrange(sim, "r c r2 c2 -> (r r2) (c c2)"), cmap="viridis", vmin=-1, vmax=1)
    for k in range(1, 8):
        ax.axhline(8 * k - 0.5, color="white", linewidth=0.5)
        ax.axvline(8 * k - 0.5, color="white", linewidth=0.5)
    ax.set(title=f"{name}: pos_embed similarity", xticks=[], yticks=[])
fig.tight_layout()
plt.show()

# %%
distance = patch_distances((8, 8))
rings = {"1": (0.5, 1.01), "√2": (1.01, 1.5), "2": (1.5, 2.01), "2-3": (2.01, 3.0), "3-5": (3.0, 5.0)}
by_distance = {name: {ring: sim.reshape(64, 64)[(distance > lo) & (distance <= hi)].mean().item()
                      for ring, (lo, hi) in rings.items()} for name, sim in similarity.items()}
nearest = {}
for name, sim in similarity.items():  # the distance from each patch to the patch whose embedding is most like its own
    others = sim.reshape(64, 64).masked_fill(torch.eye(64, dtype=torch.bool), -2)
    nearest[name] = (distance.gather(1, others.argmax(1, keepdim=True)) <= 1).float().mean().item()
assert all(abs(v) < 0.1 for v in by_distance["untrained"].values())
print("untrained: mean similarity within ±0.1 of 0 at every distance")
for name in loaded:
    print(f"{name:>10}: mean similarity at distance " + ", ".join(f"{k} {v:+.2f}" for k, v in by_distance[name].items())
          + f"; most similar patch a neighbour for {nearest[name]:.0%} of patches")
for name in loaded:
    values = list(by_distance[name].values())
    assert values[0] > 0.5 and all(a > b for a, b in zip(values, values[1:4]))  # falls with distance
assert nearest["ConViT"] > nearest["DeiT"]

# %% [markdown]
# Both trained embeddings code position the same way: a patch is most like its neighbours (similarity about 0.6 at
# one patch, falling through √2 and 2 to about 0 at 2–3 patches and below it further out), and the maps show a second
# code, centre against border: the border patches resemble one another across the image, most in the DeiT, where
# for fewer patches the most similar one is a neighbour. One seed of each: a picture of what these two runs learned,
# not a comparison of the models. It is what masking the embedding removes in Table 5, next: for the DeiT the only
# position it has; for the ConViT one of two, its GPSA layers attending by relative position besides.

# %% [markdown]
# ### Tables 5 and 6: masking at test time
#
# Top-1 on the 500 validation images (50 in FAST mode) with the absolute positional embedding masked, and
# with content or position masked in the first k GPSA layers (k = 2 and 4, of 4; the paper: 3, 5 and 10 of
# 10). The paper's numbers (ImageNet, Ti models, 300 epochs): masking the positional embedding costs the
# DeiT-Ti 72.2 → 38.3 but the ConViT-Ti only 73.1 → 67.1; masking content in the first 3 / 5 / 10 GPSA
# layers leaves the ConViT-Ti 62.3 / 35.0 / 1.3 %, masking position 63.5 / 53.1 / 46.8 %.

# %%
# NBVAL_IGNORE_OUTPUT
from torch.utils.data import Subset

eval_set = Subset(val_set, range(0, len(val_set), 10)) if FAST else val_set
tables = {"DeiT": masking_table(loaded["DeiT"], eval_set, batch_size=250),
          "ConViT": masking_table(loaded["ConViT"], eval_set, layer_counts=[2, 4], batch_size=250)}
print(format_masking(tables))
assert tables["ConViT"]["no mask"] == evaluate(loaded["ConViT"], eval_set, batch_size=250)["top1"]

# %% [markdown]
# The masks are undone on leaving the `with` block: evaluating again gives the unmasked accuracy, and the
# positional embedding and gates are back.

# %%
model = loaded["ConViT"]
with mask_at_test_time(model, gate=1.0, num_layers=4):
    assert all(layer.gate_override == 1.0 for layer in model.local_layers)
assert all(layer.gate_override is None for layer in model.local_layers) and not model.mask_pos_embed

# %% [markdown]
# ## What the paper saw, and what we see here
#
# The paper's models trained for 300 epochs on 1.28 M images, ours on about 3 200 times fewer images seen (chapter
# 34_attention_maps): at that budget the directions are the paper's and the sizes are not.
#
# * **Masking (Tables 5-6).** Masking the absolute positional embedding costs our DeiT 5.6 points and our
#   ConViT 2.4, the direction of Table 5 (72.2 → 38.3 for DeiT-Ti, 73.1 → 67.1 for ConViT-Ti), but the
#   difference between the two drops is within the noise of 500 validation images: a top-1 near 60 % has a
#   standard error of √(0.6 · 0.4 / 500) ≈ 2.2 points, and a difference of two drops, four top-1s, about 4.4 if
#   they were independent (they are not, being scored on the same images; a paired test, not done here, would
#   be tighter). Masking the
#   *positional* attention of all 4 GPSA layers costs our ConViT 15 points, masking their content 1.6 — the
#   opposite of the paper's Table 6, where content is what the late layers need — because our gates are
#   still at 0.72: the heads have not yet learned to rely on content.
#
# The cell below checks these statements and prints the numbers they quote, in full mode, where the whole validation
# set is used.

# %%
# NBVAL_IGNORE_OUTPUT
# (full mode only: FAST mode masks on a tenth of the images)
def top1_se(top1: float, n: int) -> float:
    """Binomial standard error, in points, of a top-1 (in %) measured on n images."""
    return 100 * (top1 / 100 * (1 - top1 / 100) / n) ** 0.5


if not FAST:
    deit_t, convit_t = tables["DeiT"], tables["ConViT"]
    diff_se = 2 * top1_se(convit_t["no mask"], len(eval_set))  # four top-1s, as if independent
    deit_drop = deit_t["no mask"] - deit_t["mask pos embed"]
    convit_drop = convit_t["no mask"] - convit_t["mask pos embed"]
    assert 0 < deit_drop - convit_drop < 2 * diff_se  # Table 5's direction, within noise
    position_drop = convit_t["no mask"] - convit_t["mask position, first 4"]
    content_drop = convit_t["no mask"] - convit_t["mask content, first 4"]
    assert position_drop - content_drop > 2 * diff_se  # position matters more here, beyond noise
    print(f"pos embed masked: DeiT -{deit_drop:.1f}, ConViT -{convit_drop:.1f} points; all 4 GPSA layers: "
          f"position -{position_drop:.1f}, content -{content_drop:.1f}; SE of a difference of drops {diff_se:.1f}")

# %% [markdown]
# ## Exercises
#
# **1. Chance similarity.** Two independent random vectors of 72 numbers have a cosine similarity of mean 0 and
# standard deviation about 1/√72. How far do the untrained embedding's similarities spread? Compute the standard
# deviation of `similarity["untrained"]` over the pairs of distinct patches and set `chance_sd`; compare it with
# 1/√72.

# %%
chance_sd = ...  # your answer: chance_sd = ...

# %%
def check_chance_sd(answer: float) -> None:
    sim = similarity["untrained"].reshape(64, 64)
    distinct = sim[~torch.eye(64, dtype=torch.bool)]
    check_answer(not math.isclose(answer, sim.std().item(), rel_tol=1e-4), "leave out the diagonal: a patch's "
                 "similarity with itself is 1, not chance")
    check_answer(not math.isclose(answer, distinct.mean().item(), rel_tol=1e-4), "the spread of the similarities, "
                 "their standard deviation, not their mean (which is near 0)")
    check_answer(math.isclose(answer, distinct.std().item(), rel_tol=1e-4), "the standard deviation of the 64 · 63 "
                 "similarities of distinct patches (its square is their variance)")


grade("chance_sd", chance_sd, check_chance_sd)
untrained_sim = similarity["untrained"].reshape(64, 64)
demonstrate(check_chance_sd, {"with the diagonal": untrained_sim.std().item(),
                              "the mean": untrained_sim[~torch.eye(64, dtype=torch.bool)].mean().item(),
                              "the variance": untrained_sim[~torch.eye(64, dtype=torch.bool)].var().item()})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(chance_sd):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    sim = similarity["untrained"].reshape(64, 64)
    chance_sd = sim[~torch.eye(64, dtype=torch.bool)].std().item()
    print(f"{chance_sd:.3f}, against 1/√72 = {1 / math.sqrt(72):.3f}: the untrained maps are chance")
    grade("chance_sd", chance_sd, check_chance_sd)

# %% [markdown]
# **2. Two neighbours by hand.** From the trained DeiT's `pos_embed` (`loaded["DeiT"].pos_embed`, shape (1, 1 + 64,
# 72): its class token's slot first, then the patches row by row), compute the cosine similarity of the embeddings
# of patch (3, 3) and patch (3, 4) (row, column) and set `neighbour_similarity`, without `position_similarity`.

# %%
neighbour_similarity = ...  # your answer: neighbour_similarity = ...

# %%
def check_neighbour_similarity(answer: float) -> None:
    embed = loaded["DeiT"].pos_embed[0].detach().float()
    cosine = lambda i, j: F.cosine_similarity(embed[i], embed[j], dim=0).item()
    check_answer(not math.isclose(answer, (embed[28] @ embed[29]).item(), rel_tol=1e-4), "a cosine similarity "
                 "divides the dot product by both lengths")
    check_answer(not math.isclose(answer, cosine(27, 28), rel_tol=1e-4), "the class token's slot comes first: "
                 "patch (r, c) is slot 1 + 8 r + c")
    check_answer(math.isclose(answer, position_similarity(loaded["DeiT"])[3, 3, 3, 4].item(), rel_tol=1e-4),
                 "patch (3, 4) is row 3, column 4: the token after (3, 3), slot 29, not 8 further on")


grade("neighbour_similarity", neighbour_similarity, check_neighbour_similarity)
deit_embed = loaded["DeiT"].pos_embed[0].detach().float()
demonstrate(check_neighbour_similarity, {
    "the dot product": (deit_embed[28] @ deit_embed[29]).item(),
    "slot 0 taken for patch (0, 0)": F.cosine_similarity(deit_embed[27], deit_embed[28], dim=0).item(),
    "(4, 3) for (3, 4)": F.cosine_similarity(deit_embed[28], deit_embed[36], dim=0).item()})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(neighbour_similarity):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    patches = loaded["DeiT"].pos_embed[0, 1:].detach().float()  # the class token's slot left out
    a, b = patches[3 * 8 + 3], patches[3 * 8 + 4]
    neighbour_similarity = (a @ b / (a.norm() * b.norm())).item()
    print(f"patches (3, 3) and (3, 4): cosine similarity {neighbour_similarity:.2f}")
    grade("neighbour_similarity", neighbour_similarity, check_neighbour_similarity)
