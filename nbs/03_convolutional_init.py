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
# # Convolutional initialisation: head centres and locality strength
#
# Chapter 02 gave every (query, key) pair its relative position r_δ = (δx, δy, ‖δ‖²) and added a positional
# score v_posᵀ r_δ to the content score (Eq. 4). This chapter chooses v_pos so that each head looks at one
# offset of a convolution kernel (Eq. 5), and draws the attention maps of Fig. 3 on a real image. Chapter 04
# then proves, by running it, the result the whole paper builds on (Cordonnier et al., 2020): a positional
# self-attention layer with N_h = k² heads computes any k×k convolution — with as many output channels as a
# head is wide (min(D_h, D_out)).

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp conv_init

# %%
import warnings

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from einops import rearrange
from matplotlib import cbook
from PIL import Image
from torch import nn
from torchvision.transforms.functional import pil_to_tensor

from convit_edu.attention import MHSA
from convit_edu.positional import rel_indices

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## Eq. 5: a positional score that is a Gaussian bump
#
# The paper sets, for head h,
#
# $$v^h_{pos} := -\alpha_h\,(1, -2\Delta^h_1, -2\Delta^h_2), \qquad r_\delta := (\|\delta\|^2, \delta_1, \delta_2),
# \qquad W_{qry} = W_{key} := 0,\quad W_{val} := I. \tag{5}$$
#
# Our `rel_indices` (chapter 02) stores the channels in the order of the official code, (δx, δy, ‖δ‖²), so
# the same embedding reads **α·(2Δx, 2Δy, −1)** and lives in row h of `pos_proj.weight`. The score of a key at
# offset δ from the query is then
#
# $$v^{h\top}_{pos} r_\delta = \alpha\,(2\Delta\cdot\delta - \|\delta\|^2) = -\alpha\,\|\delta - \Delta\|^2 + \alpha\,\|\Delta\|^2 .$$
#
# The last term is the same for every key, and a softmax over keys ignores constants, so head h's attention is
# a Gaussian on the patch lattice **centred at the offset Δ_h**, narrower as α grows. Δ_h is *where* the head
# looks, α (`locality_strength`) *how sharply*. The same reasoning says the bias of `pos_proj` (one constant per
# head) never changes the attention. The continuous Gaussian's variance would be 1/(2α) per axis; the lattice's
# keeps to it only for α up to about 1, and is far below it for sharper heads:

# %%
offsets = torch.arange(-30, 31, dtype=torch.float64)  # one axis of a wide grid, the head centred on 0
for alpha in (1.0, 2.0, 4.0):
    weights = (-alpha * offsets**2).exp()
    variance = float((offsets**2 * weights).sum() / weights.sum())
    print(f"alpha {alpha:g}: variance on the lattice {variance:.3f}, continuous 1/(2 alpha) {1 / (2 * alpha):.3f}")
    assert abs(variance - 0.5) < 0.01 if alpha == 1 else variance < 0.9 / (2 * alpha)

# %% [markdown]
# By hand, on a 5×5 grid, query in the middle, one head with Δ = (1, 0) (one patch to the right) and α = 1:

# %%
height = width = 5
rel = rel_indices(height, width)
query = 2 * width + 2  # row 2, column 2: the centre
centre, alpha = torch.tensor([1.0, 0.0]), 1.0
score = rel[query] @ (alpha * torch.tensor([2 * centre[0], 2 * centre[1], -1.0]))
print(score.reshape(height, width))
delta = rel[query, :, :2]
torch.testing.assert_close(score, -alpha * (delta - centre).pow(2).sum(-1) + alpha * centre.pow(2).sum())
attn = score.softmax(-1).reshape(height, width)
print(attn)
assert attn.argmax() == query + 1  # the patch to the right of the query

# %% [markdown]
# ## Head centres Δ_h
#
# With N_h heads, the ConViT places the centres on a k×k square of offsets around the query, k = ⌊√N_h⌋,
# centred at c = (k − 1)/2: head h = h1 + k·h2 gets Δ = (h2 − c, h1 − c). For 9 heads that is every offset of
# a 3×3 kernel; for 16 heads, a 4×4 kernel.
#
# **Even k.** A kernel with an even side has no middle tap, so c is a half-integer: 4 heads sit at
# (±½, ±½), symmetric around the query. The score −α‖δ − Δ‖² of Δ = (½, ½) is then the *same* for the four
# patches δ ∈ {0, 1}²: such a head never singles out one patch, however large α; as α → ∞ it averages a 2×2
# block. (The text under Eq. 5 gives Fig. 3(c)'s 4 centres as (±1, ±1); the official code, with which the
# checkpoints were trained, uses (±½, ±½), and so do we.) For an *exact* even convolution the centres must
# be moved by half a patch onto integer offsets — that is what chapter 04's proof does.
#
# **N_h not a perfect square.** 6 heads give k = 2: four local heads, and two heads with no place on the
# kernel. The official code leaves those two with their random positional weights, so they start with a broad,
# random positional pattern: not local like the others, nor uniform either. `head_centres` reports them as NaN rows and warns — once, through Python's
# `warnings`, so a 10-layer model does not print it ten times.

# %%
#| export
import math
import warnings

import torch
from torch import Tensor, nn


def check_locality_strength(locality_strength: float) -> float:
    """α as a float, or a ValueError: Eq. 5 needs α > 0 (α ≤ 0 attends *away* from the centre, or uniformly).

    The one rule for α, shared by ``local_init`` and ``ModelConfig`` (chapter 09)."""
    alpha = float(locality_strength)
    if not alpha > 0:  # also rejects NaN
        raise ValueError(f"locality_strength (α) must be > 0, got {locality_strength!r}")
    return alpha


def head_centres(num_heads: int) -> Tensor:
    """Attention centres Δ_h = (Δx, Δy) of Eq. 5, shape (num_heads, 2), in patches relative to the query.

    Head h = h1 + k·h2 with k = ⌊√num_heads⌋ gets Δ = (h2 − c, h1 − c), c = (k − 1)/2 (half-integers for even
    k), as in the official ConViT. Heads h ≥ k² have no centre: their rows are NaN, and a warning says so.
    """
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive integer, got {num_heads!r}")
    k = math.isqrt(num_heads)
    if k * k != num_heads:
        warnings.warn(
            f"num_heads={num_heads} is not a perfect square: only {k * k} heads get a convolutional "
            f"(local) initialisation on a {k}x{k} kernel; the other {num_heads - k * k} keep their "
            "random positional weights",
            stacklevel=2,
        )
    c = (k - 1) / 2
    h = torch.arange(k * k)
    h1, h2 = h % k, h // k
    local = torch.stack([h2 - c, h1 - c], dim=-1).to(torch.float32)
    return torch.cat([local, torch.full((num_heads - k * k, 2), math.nan)])


def v_pos(centres: Tensor, locality_strength: float) -> Tensor:
    """Positional embeddings of Eq. 5 in the channel order of ``rel_indices``: rows α·(2Δx, 2Δy, −1), (N, 3).

    With r_δ = (δx, δy, ‖δ‖²) the score of each head is α(2Δ·δ − ‖δ‖²) = −α‖δ − Δ‖² + const.
    """
    alpha = check_locality_strength(locality_strength)
    if centres.ndim != 2 or centres.shape[1] != 2:
        raise ValueError(f"centres must have shape (N, 2) of (Δx, Δy), got {tuple(centres.shape)}")
    return alpha * torch.cat([2 * centres, -torch.ones_like(centres[:, :1])], dim=1)


def local_init(pos_proj: nn.Linear, v: nn.Linear, locality_strength: float) -> None:
    """Convolutional initialisation of a (G)PSA layer, Eq. 5, in place.

    Row h of ``pos_proj.weight`` becomes α·(2Δx, 2Δy, −1) and its bias 0 for the k² local heads of
    ``head_centres``; the other heads keep their weights. ``v`` becomes the identity (bias 0). The query and
    key weights keep their random init: GPSA's gate, not W_qry = W_key = 0, decides how much content counts.
    """
    alpha = check_locality_strength(locality_strength)
    if pos_proj.in_features != 3:
        raise ValueError(f"pos_proj must read the 3 channels of rel_indices, got in_features={pos_proj.in_features}")
    if v.in_features != v.out_features:
        raise ValueError(f"v must be square to start as the identity, got {v.in_features} -> {v.out_features}")
    centres = head_centres(pos_proj.out_features)
    local = ~centres.isnan().any(dim=1)
    with torch.no_grad():
        pos_proj.weight[local] = v_pos(centres[local], alpha).to(pos_proj.weight)
        if pos_proj.bias is not None:
            pos_proj.bias[local] = 0.0
        v.weight.copy_(torch.eye(v.in_features))
        if v.bias is not None:
            v.bias.zero_()

# %% [markdown]
# The centres, for the head counts of ConViT-Ti (4), ConViT-S (9) and ConViT-B (16):

# %%
for num_heads in (4, 9, 16):
    centres = head_centres(num_heads)
    print(f"N_h={num_heads:>2}:", [tuple(c) for c in centres.tolist()])
    torch.testing.assert_close(centres.mean(0), torch.zeros(2))  # symmetric around the query
    assert len(set(map(tuple, centres.tolist()))) == num_heads  # one offset per head
assert head_centres(9).tolist()[:4] == [[-1.0, -1.0], [-1.0, 0.0], [-1.0, 1.0], [0.0, -1.0]]  # h = h1 + 3·h2

# %% [markdown]
# Six heads, and the warning (caught here so that it prints as text):

# %%
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    centres = head_centres(6)
print(centres)
print(caught[0].message)
assert centres[4:].isnan().all() and not centres[:4].isnan().any()

# %% [markdown]
# `local_init` writes Eq. 5 into a layer's `pos_proj` and `v`. Each head's attention, for a query in the
# middle of a 7×7 grid, then peaks at query + Δ_h (exactly one patch for 9 heads), and its centre of mass is
# query + Δ_h (also for the half-integer centres of 4 heads):

# %%
#| export
from einops import rearrange

from convit_edu.positional import rel_indices


def positional_attention(pos_proj: nn.Linear, height: int, width: int) -> torch.Tensor:
    """Softmax over keys of the positional scores, (N_h, L, L): the attention of W_qry = W_key = 0."""
    return rearrange(pos_proj(rel_indices(height, width)).softmax(dim=1), "q k h -> h q k")


# %%
for num_heads, alpha in ((9, 1.0), (4, 1.0)):
    pos_proj, v = nn.Linear(3, num_heads), nn.Linear(12, 12)
    local_init(pos_proj, v, alpha)
    torch.testing.assert_close(v.weight, torch.eye(12))
    attn = positional_attention(pos_proj, 7, 7)[:, 3 * 7 + 3].detach()  # query at row 3, column 3
    xy = rel_indices(7, 7)[3 * 7 + 3, :, :2]  # offsets of every key from the query
    mass_centre = attn @ xy
    torch.testing.assert_close(mass_centre, head_centres(num_heads), atol=1e-3, rtol=0)
    if num_heads == 9:
        assert (xy[attn.argmax(-1)] == head_centres(9)).all()
    print(f"N_h={num_heads}: centres of mass", [tuple(round(c, 3) + 0.0 for c in row) for row in mass_centre.tolist()])

# %% [markdown]
# ## Fig. 3: convolutional attention maps on a real image
#
# The paper's Fig. 3 shows, for one query patch, the attention maps of (b) an untrained SA layer and of a PSA
# layer with the convolutional initialisation at (c) α = 0.5 and (d) α = 2. We use the photograph of Grace
# Hopper that ships with matplotlib, cut into 14×14 patches of 16×16 pixels like a 224-pixel ImageNet input.
# The untrained SA layer (`MHSA` of chapter 01) reads a randomly initialised patch embedding (a 16×16
# convolution with stride 16, then a LayerNorm as in a pre-norm block). Its score for a key is a random
# bilinear form of the query's and the key's tokens, so its map is a random read-out of each key patch's
# content: the picture shows through (each head with its own random sign — one favours patches that look like
# the query, another avoids them). The PSA maps depend only on position: they are the same for every image.
# We use 9 heads, as ConViT-S does, rather than ConViT-Ti's 4: their centres are the 9 taps of a 3 × 3 kernel,
# the query patch itself included, so each head visibly looks at a different neighbour; 4 heads centred at
# (±½, ±½) would each straddle four patches next to the query and look much alike. The query patch is outlined
# in red in every map.

# %%
with cbook.get_sample_data("grace_hopper.jpg") as f:
    photo = Image.open(f).convert("RGB").resize((224, 224), Image.BICUBIC)
image = pil_to_tensor(photo)[None].float() / 255
image = (image - image.mean()) / image.std()
grid, patch, dim, heads = 14, 16, 144, 9  # 9 heads: a 3 × 3 kernel whose taps are whole patches
query_row, query_col = 5, 6
query = query_row * grid + query_col

torch.manual_seed(0)
patch_embed = nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
norm = nn.LayerNorm(dim)
sa = MHSA(dim, heads)


def sa_tokens(img: torch.Tensor) -> torch.Tensor:
    """The L patch tokens (1, L, D) that the untrained SA layer reads."""
    return norm(rearrange(patch_embed(img), "1 d h w -> 1 (h w) d"))


def sa_attention(img: torch.Tensor) -> torch.Tensor:
    """Per-head attention maps (N_h, L, L) of the untrained SA layer on one image."""
    _, attn = sa(sa_tokens(img), return_attention=True)
    return attn[0].detach()


maps = {"(b) untrained SA": sa_attention(image)[:, query]}
for alpha in (0.5, 2.0):
    pos_proj = nn.Linear(3, heads)
    local_init(pos_proj, nn.Linear(dim, dim), alpha)
    maps[f"PSA, α = {alpha}"] = positional_attention(pos_proj, grid, grid)[:, query].detach()
print({name: tuple(m.shape) for name, m in maps.items()})

# %% [markdown]
# The claims of the caption and of the text under Eq. 5, checked: the SA maps change with the image (here, the image flipped left-right),
# the PSA maps do not depend on it at all, and α = 2 is more concentrated than α = 0.5 (a larger share of
# each head's attention on its four most-attended patches).
#
# And the picture shows through the SA maps: across the 196 keys, a head's log-attention follows how much each
# key patch resembles the query patch (the cosine similarity of their tokens), with a sign of its own. We
# compare each head's |correlation| with 1000 shuffles of its map over the keys: a map that ignored the
# picture would beat the 99th percentile of its shuffles in one head out of a hundred.

# %%
flipped = sa_attention(image.flip(-1))[:, query]
assert (flipped - maps["(b) untrained SA"]).abs().max() > 1e-3


def correlation(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Pearson correlation of the last dimension of ``x`` with ``y``."""
    x, y = x - x.mean(-1, keepdim=True), y - y.mean()
    return (x * y).sum(-1) / (x.norm(dim=-1) * y.norm())


tokens = sa_tokens(image)[0].detach()
similarity = F.cosine_similarity(tokens, tokens[query], dim=-1)  # (L,): how alike each key is to the query
log_sa = maps["(b) untrained SA"].log()
shuffles = torch.stack([log_sa[:, torch.randperm(grid * grid, generator=torch.Generator().manual_seed(s))]
                        for s in range(1000)])  # (1000, N_h, L)
observed = correlation(log_sa, similarity).abs()
control = correlation(shuffles, similarity).abs().quantile(0.99, dim=0)
follows = int((observed > control).sum())
assert follows >= 3, (observed, control)
print(f"heads whose map follows the key patches' likeness to the query beyond 99 % of shuffles: {follows} of {heads}")
top4 = {name: m.topk(4, dim=-1).values.sum(-1) for name, m in maps.items()}
assert (top4["PSA, α = 2.0"] > top4["PSA, α = 0.5"]).all()
print({name: [round(v, 3) for v in t.tolist()] for name, t in top4.items()})

# %%
fig, axes = plt.subplots(3, heads + 1, figsize=(15, 5), dpi=80)
for row, (name, m) in enumerate(maps.items()):
    ax = axes[row, 0]
    ax.imshow(photo)
    ax.add_patch(plt.Rectangle((query_col * patch, query_row * patch), patch, patch, fill=False, color="red", lw=2))
    ax.set_ylabel(name)
    for h in range(heads):
        axes[row, h + 1].imshow(m[h].reshape(grid, grid), cmap="viridis")
        axes[row, h + 1].add_patch(plt.Rectangle((query_col - 0.5, query_row - 0.5), 1, 1, fill=False, color="red"))
        axes[row, h + 1].set_title(f"head {h + 1}", fontsize=9)
for ax in axes.flat:
    ax.set_xticks([])
    ax.set_yticks([])
fig.tight_layout()
plt.show()

# %% [markdown]
# ## What we have
#
# `convit_edu.conv_init` exports `head_centres` (Δ_h), `v_pos` (Eq. 5 in the `rel_indices` channel order),
# `local_init` (used by every GPSA layer), `positional_attention` and `check_locality_strength`. Chapter 04
# uses them to build a PSA layer that *is* a given convolution, and shows what a ConViT layer computes at init.

# %% [markdown]
# ## Exercises
#
# **1. α and the size of a head's footprint.** For the 9 heads of a 3 × 3 kernel (`local_init`, query in the
# middle of a 7 × 7 grid, no content), find the smallest α, to one decimal, at which *every* head puts at least
# 90 % of its attention on its own centre patch. Predict it first from the softmax (the nearest other patches
# are 1 away, the next ones √2), then compute it; set `alpha_90` to your value.

# %%
alpha_90 = ...  # your answer: alpha_90 = ...

# %%
from convit_edu.checks import check_answer, demonstrate, grade, reveal


def check_alpha_90(answer: float) -> None:
    def share(alpha: float) -> float:
        pos_proj = nn.Linear(3, 9)
        local_init(pos_proj, nn.Linear(3, 3), alpha)
        attn = positional_attention(pos_proj, 7, 7)[:, 3 * 7 + 3].detach()
        return float(attn.max(dim=-1).values.min())  # each head's peak is its centre (checked earlier)

    check_answer(isinstance(answer, (int, float)) and not isinstance(answer, bool), f"α is a number, got {answer!r}")
    check_answer(share(answer) >= 0.9, f"at α = {answer} some head keeps less than 90 % on its centre: larger (the 4 "
                 "diagonal patches, √2 away, take their share too)")
    check_answer(share(answer - 0.1) < 0.9, f"α = {answer - 0.1:.1f} already reaches 90 %: look for the smallest")


grade("alpha_90", alpha_90, check_alpha_90)
demonstrate(check_alpha_90, {"a string": "3.7", "ln 36 from the 4 nearest patches alone": 3.6,
                             "a safe margin": 5.0})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(alpha_90):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def centre_share(alpha: float) -> float:
        """The smallest share of attention any of the 9 heads puts on its own centre patch."""
        pos_proj = nn.Linear(3, 9)
        local_init(pos_proj, nn.Linear(3, 3), alpha)
        attn = positional_attention(pos_proj, 7, 7)[:, 3 * 7 + 3].detach()  # (heads, keys)
        targets = [(3 + int(dy)) * 7 + 3 + int(dx) for dx, dy in head_centres(9).tolist()]
        return float(attn[torch.arange(9), targets].min())


    alpha_90 = next(a / 10 for a in range(1, 200) if centre_share(a / 10) >= 0.9)
    # prediction: the 4 nearest patches alone give 4·e^(−α) = 1/9, α = ln 36 ≈ 3.6; the 4 diagonal ones add a little
    print(f"alpha_90 = {alpha_90}")
    grade("alpha_90", alpha_90, check_alpha_90)

# %% [markdown]
# **2. Which head looks up and to the right?** Take the same 9 heads (`local_init` at α = 1, no content) and the
# query in the middle of a 7 × 7 grid (row 3, column 3). Which head attends most to the key one row *above* and
# one column to the right of the query (row 2, column 4)? Work it out from the numbering of `head_centres`
# (head h = h1 + 3·h2 is centred at Δ = (Δx, Δy) = (h2 − 1, h1 − 1); rows grow downwards), then set
# `head_up_right` to its index h, counted from 0 as `head_centres` counts.

# %%
head_up_right = ...  # your answer: head_up_right = ...

# %%
def check_head_up_right(answer: int) -> None:
    check_answer(isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer < 9,
                 f"a head index is an int from 0 to 8, got {answer!r}")
    pos_proj = nn.Linear(3, 9)
    local_init(pos_proj, nn.Linear(3, 3), 1.0)
    on_key = positional_attention(pos_proj, 7, 7)[:, 3 * 7 + 3, 2 * 7 + 4].detach()  # every head, that key
    want = int(on_key.argmax())
    dx, dy = (int(c) for c in head_centres(9)[answer].tolist())
    moves = [f"one column {'left' if dx < 0 else 'right'}"] * (dx != 0) + [f"one row {'up' if dy < 0 else 'down'}"] * (dy != 0)
    where = " and ".join(moves) or "the query itself"
    from_1 = " (if you counted from 1, as the titles of Fig. 3 do, subtract 1)" if answer == want + 1 else ""
    check_answer(answer == want, f"head {answer} is centred at Δ = ({dx}, {dy}): {where}. Δx is the column "
                 f"offset, Δy the row offset (rows grow downwards), and Δ = (h2 − 1, h1 − 1) takes Δx from h2 = h // 3{from_1}")


grade("head_up_right", head_up_right, check_head_up_right)
demonstrate(check_head_up_right, {"x and y swapped": 2, "counted from 1": 7, "a head index of 9": 9})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(head_up_right):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    # the key sits at δ = (column offset, row offset) = (+1, −1): rows grow downwards, so "above" is δy = −1.
    # Δ = (h2 − 1, h1 − 1) = (1, −1) gives h2 = 2 and h1 = 0, so h = h1 + 3·h2:
    head_up_right = 0 + 3 * 2
    print(f"head_up_right = {head_up_right}, centred at Δ = {tuple(int(c) for c in head_centres(9)[head_up_right])}")
    grade("head_up_right", head_up_right, check_head_up_right)

# %% [markdown]
# **3. Eq. 5 from the equation.** Write `my_local_init(pos_proj, v, alpha)`: for a layer whose number of heads
# N_h = `pos_proj.out_features` is a perfect square k², set row h of `pos_proj.weight` to α·(2Δx, 2Δy, −1) with
# head h = h1 + k·h2 centred at Δ = (Δx, Δy) = (h2 − c, h1 − c), c = (k − 1)/2; set `pos_proj.bias` to 0, and
# `v` to the identity with a zero bias. Use only torch (not `head_centres`, `v_pos` or `local_init`). (The layers of
# the chapters after this one are initialised by the package's `local_init`.)

# %%
my_local_init = ...  # your answer: def my_local_init(pos_proj, v, alpha): ...

# %%
def check_local_init(fn) -> None:
    for heads, alpha in ((4, 1.0), (9, 0.5), (16, 2.0)):
        mine, theirs = (nn.Linear(3, heads), nn.Linear(6, 6)), (nn.Linear(3, heads), nn.Linear(6, 6))
        fn(*mine, alpha)
        local_init(*theirs, alpha)
        wrong = (mine[0].weight - theirs[0].weight).abs().sum(1).nonzero().flatten().tolist()
        check_answer(not wrong, f"{heads} heads, α = {alpha}: rows {wrong[:4]} of pos_proj.weight differ; "
                     "row h is α·(2Δx, 2Δy, −1), Δx = h // k − c is the *column* offset (from h2), Δy = h % k − c")
        check_answer(torch.equal(mine[0].bias, torch.zeros(heads)), "pos_proj.bias must start at 0")
        check_answer(torch.equal(mine[1].weight, torch.eye(6)) and torch.equal(mine[1].bias, torch.zeros(6)),
                     "v must start as the identity, with a zero bias")


@torch.no_grad()
def swapped(pos_proj: nn.Linear, v: nn.Linear, alpha: float) -> None:  # a slip: Δx and Δy swapped
    local_init(pos_proj, v, alpha)
    pos_proj.weight[:, :2] = pos_proj.weight[:, [1, 0]].clone()


@torch.no_grad()
def bias_kept(pos_proj: nn.Linear, v: nn.Linear, alpha: float) -> None:  # a slip: pos_proj's bias not zeroed
    local_init(pos_proj, v, alpha)
    pos_proj.bias.fill_(0.1)


def v_kept(pos_proj: nn.Linear, v: nn.Linear, alpha: float) -> None:  # a slip: v not set to the identity
    local_init(pos_proj, nn.Linear(v.in_features, v.out_features), alpha)


grade("my_local_init", my_local_init, check_local_init)
demonstrate(check_local_init, {"Δx and Δy swapped": swapped, "pos_proj's bias left as it was": bias_kept,
                               "v left as it was": v_kept})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(my_local_init):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def my_local_init(pos_proj: nn.Linear, v: nn.Linear, alpha: float) -> None:
        k = int(pos_proj.out_features**0.5)
        c = (k - 1) / 2
        h = torch.arange(k * k)
        dx, dy = h // k - c, h % k - c  # Δx from h2 = h // k (the column offset), Δy from h1 = h % k
        with torch.no_grad():
            pos_proj.weight.copy_(alpha * torch.stack([2 * dx, 2 * dy, -torch.ones(k * k)], dim=1))
            pos_proj.bias.zero_()
            v.weight.copy_(torch.eye(v.in_features))
            v.bias.zero_()

    grade("my_local_init", my_local_init, check_local_init)
