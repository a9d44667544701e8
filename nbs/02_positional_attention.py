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
# # Positional self-attention: relative positions on a patch grid (Eq. 4)
#
# Chapter 01 ended with a negative result: self-attention is permutation-equivariant, so a layer of it cannot
# tell a patch in the corner from a patch in the centre. This chapter gives attention a sense of place. We lay
# the patches on an H×W grid, describe every (query, key) pair by the offset δ between them — the tensor
# `rel_indices` that every GPSA layer of the ConViT carries — and add a score computed from δ to the content
# score of Eq. 1, before one softmax: **positional self-attention** (PSA, Eq. 4), which you write yourself before the
# chapter shows its own.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp positional

# %%
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## Two ways to tell attention where things are
#
# * **Absolute** positions: add a learned vector to each patch embedding before the first layer. ViT and DeiT do
#   this (`pos_embed`), and the ConViT keeps it too. Attention then has to *learn* from data that "my
#   neighbour" means "the embedding whose position part is close to mine".
# * **Relative** positions: give every attention score a term that depends only on where the key sits
#   *relative to* the query. A head that prefers "one patch to the right" prefers it everywhere in the image,
#   which is exactly the weight sharing of a convolution.
#
# The ConViT's GPSA layers use the second. First we need the geometry.
#
# ## The patch grid and the token order
#
# An image of 224×224 pixels cut into 16×16 patches gives a 14×14 grid of L = 196 tokens; a 224×320 image
# gives 14×20. Tokens are numbered **row-major**: token t sits in row t // W and column t % W, i.e.
# t = row·W + col. Here is a 2×3 grid:

# %%
height, width = 2, 3
print(torch.arange(height * width).reshape(height, width))

# %% [markdown]
# This is the order a patch embedding produces: a 16×16 convolution with stride 16 turns the image into a
# (B, D, H, W) feature map, and `flatten(2)` lays its H·W positions out row by row. We check it with a "feature
# map" whose two channels hold each patch's own column and row, for a 224×320 image:

# %%
img_h, img_w, patch = 224, 320, 16
H_img, W_img = img_h // patch, img_w // patch
rows, cols = torch.meshgrid(torch.arange(H_img), torch.arange(W_img), indexing="ij")
feature_map = torch.stack([cols, rows])[None]  # (B=1, D=2, H, W): channel 0 = column, channel 1 = row
tokens = feature_map.flatten(2).transpose(1, 2)  # (B, L, D), as a ViT patch embedding does
t = torch.arange(H_img * W_img)
assert torch.equal(tokens[0], torch.stack([t % W_img, t // W_img], dim=-1))
print(f"{img_h}×{img_w} image, {patch}×{patch} patches -> {H_img}×{W_img} grid, L = {tokens.shape[1]} tokens")

# %% [markdown]
# We write the position of a patch as (x, y) = (column, row): x grows to the right, y grows **downwards**, as
# in image coordinates. `grid_coordinates` returns them for every token, in token order.

# %%
#| exporti
import torch
from torch import Tensor

from convit_edu.checks import positive_int


def _check_grid(height: int, width: int) -> tuple[int, int]:
    """Grid sizes as ints, or an error naming the bad one (before any tensor is built)."""
    return positive_int("grid height", height), positive_int("grid width", width)


# %%
#| export
def grid_coordinates(
    height: int, width: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
) -> Tensor:
    """(x, y) = (column, row) of every token of a row-major height×width patch grid, shape (L, 2)."""
    height, width = _check_grid(height, width)
    rows, cols = torch.meshgrid(
        torch.arange(height, device=device, dtype=dtype),
        torch.arange(width, device=device, dtype=dtype),
        indexing="ij",
    )
    return torch.stack([cols.flatten(), rows.flatten()], dim=-1)


# %%
xy = grid_coordinates(2, 3)
print(xy)
t = torch.arange(6)
assert torch.equal(xy[:, 0], (t % 3).float()) and torch.equal(xy[:, 1], (t // 3).float())

# %% [markdown]
# ## `rel_indices`: the offset δ for every (query, key) pair
#
# For a query at position p_q and a key at p_k, the offset is δ = p_k − p_q (**key minus query**): δ = (+1, 0)
# means "the key is one patch to the right of the query", δ = (0, −1) "one patch above". The paper's
# Eq. 5 encodes each offset as a vector r_δ holding δ and its squared length ‖δ‖². We store r_δ for every pair
# in one (L, L, 3) tensor, in the order of the official implementation (whose checkpoints we want to load):
#
# $$\texttt{rel\_indices}[q, k] = (\delta_x,\ \delta_y,\ \delta_x^2 + \delta_y^2), \qquad \delta = p_k - p_q .$$
#
# The paper writes the same three numbers in another order, r_δ = (‖δ‖², δ₁, δ₂); only the order of the
# components of v_pos changes with it (chapter 03). The third channel is the **squared** distance, not the
# distance: that is what lets a head's score −α‖δ − Δ‖² be a *linear* function of r_δ.

# %%
#| export
def rel_indices(
    height: int, width: int, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
) -> Tensor:
    """Relative position encodings r_δ of a height×width patch grid (Eq. 4-5), shape (L, L, 3), L = height·width.

    ``rel_indices[q, k] = (δx, δy, δx² + δy²)`` with δ = position(key) − position(query), δx the column
    offset and δy the row offset; tokens are row-major (token t = row·width + col). This is the channel order
    of the official ConViT; the paper writes r_δ = (‖δ‖², δ₁, δ₂).
    """
    xy = grid_coordinates(height, width, device=device, dtype=dtype)
    delta = xy[None, :, :] - xy[:, None, :]  # [q, k] = key - query
    return torch.cat([delta, delta.pow(2).sum(-1, keepdim=True)], dim=-1)


# %% [markdown]
# ### By hand, on a 3×3 grid
#
# Take the centre token 4 of a 3×3 grid as the query. Laid out on the grid, the δx of each key is the column
# to its right minus 1, δy the row minus 1, and ‖δ‖² is 0 at the centre, 1 at the four edge neighbours and 2
# at the corners. We write these maps out by hand and compare:

# %%
rel = rel_indices(3, 3)
print("shape", tuple(rel.shape))
for c, name in enumerate(["dx", "dy", "|d|^2"]):
    print(name, rel[4, :, c].reshape(3, 3), sep="\n")

expected_centre = torch.tensor(
    [
        [[-1, 0, 1], [-1, 0, 1], [-1, 0, 1]],  # δx: key column - 1
        [[-1, -1, -1], [0, 0, 0], [1, 1, 1]],  # δy: key row - 1
        [[2, 1, 2], [1, 0, 1], [2, 1, 2]],  # ‖δ‖²
    ],
    dtype=torch.float32,
)
assert torch.equal(rel[4].T.reshape(3, 3, 3), expected_centre)

# %% [markdown]
# And from the top-left corner (token 0) every key lies right of or below the query, so δx, δy ≥ 0; the entry
# for key 5 (row 1, column 2) is (2, 1, 5):

# %%
print(rel[0, :, 0].reshape(3, 3), rel[0, :, 1].reshape(3, 3), sep="\n")
assert torch.equal(rel[0, 5], torch.tensor([2.0, 1.0, 5.0]))
assert (rel[0, :, :2] >= 0).all()

# %% [markdown]
# ### Three properties that hold on every grid
#
# * **antisymmetry**: swapping query and key flips δ, so `rel[k, q, :2] = −rel[q, k, :2]`, while the squared
#   distance is symmetric;
# * the diagonal is zero: a token is at offset 0 from itself;
# * the third channel is δx² + δy² of the first two.
#
# Checked on a non-square 5×7 grid (L = 35), where mixing up height and width would show:

# %%
H, W = 5, 7
rel57 = rel_indices(H, W)
assert rel57.shape == (H * W, H * W, 3)
torch.testing.assert_close(rel57[..., :2].transpose(0, 1), -rel57[..., :2])
torch.testing.assert_close(rel57[..., 2].T, rel57[..., 2])
assert (rel57.diagonal(dim1=0, dim2=1) == 0).all()
torch.testing.assert_close(rel57[..., 2], rel57[..., 0] ** 2 + rel57[..., 1] ** 2)
print("dx range", rel57[..., 0].min().item(), rel57[..., 0].max().item(), "(columns: ±(W-1))")
print("dy range", rel57[..., 1].min().item(), rel57[..., 1].max().item(), "(rows: ±(H-1))")
assert rel57[..., 0].abs().max() == W - 1 and rel57[..., 1].abs().max() == H - 1

# %% [markdown]
# ### r_δ for one query, as images
#
# Each row `rel[q]` reshaped to H×W is a picture of the grid seen from query q. For the query in row 1,
# column 4 of the 5×7 grid (token 1·7 + 4 = 11, marked ×): δx grows to the right, δy downwards, and ‖δ‖² is a
# bowl centred on the query — the three ingredients from which chapter 03 builds a Gaussian-like attention
# blob around any offset.

# %%
q_row, q_col = 1, 4
q = q_row * W + q_col
fig, axes = plt.subplots(1, 3, figsize=(9, 2.4), dpi=90)
for c, (ax, title) in enumerate(zip(axes, ["δx (key − query column)", "δy (key − query row)", "‖δ‖²"])):
    span = rel57[..., c].abs().max().item()  # symmetric colour scale for δ: white is 0
    style = dict(cmap="coolwarm", vmin=-span, vmax=span) if c < 2 else dict(cmap="viridis", vmin=0)
    img = ax.imshow(rel57[q, :, c].reshape(H, W), **style)
    ax.plot(q_col, q_row, "kx", markersize=10)
    ax.set_title(title, fontsize=9)
    ax.set_xticks(range(W)), ax.set_yticks(range(H))
    fig.colorbar(img, ax=ax, shrink=0.8)
fig.suptitle(f"r_δ seen from query token {q} (row {q_row}, column {q_col}) of a {H}×{W} grid", fontsize=10)
plt.tight_layout()
plt.show()

# %%
maps = rel57[q].T.reshape(3, H, W)
assert maps[0, q_row, q_col] == 0 and maps[1, q_row, q_col] == 0 and maps[2].argmin() == q
assert torch.equal(maps[0][q_row], torch.arange(W) - float(q_col))  # δx along the query's row
assert torch.equal(maps[1][:, q_col], torch.arange(H) - float(q_row))  # δy down the query's column

# %% [markdown]
# ## Eq. 4: positional self-attention
#
# PSA (Ramachandran et al., 2019) adds to the content score of head h a positional score v_pos^h · r_ij and
# takes **one** softmax over the sum:
#
# $$A^h_{ij} = \operatorname{softmax}_j\!\left(\frac{Q^h_i K^{h\top}_j}{\sqrt{D_h}} + v_{pos}^{h\top} r_{ij}\right)
# \qquad (4)$$
#
# Each head has its own small vector v_pos^h ∈ R^{D_pos} (D_pos = 3 here; in the ConViT it is the weight of a `pos_proj`
# = Linear(3 → N_h) layer). In Eq. 4 the relative encodings r_ij are learned too; the ConViT fixes them to (δx, δy,
# ‖δ‖²) — its own change, the paper's "adaptive attention span" paragraph — so that PSA learns only N_h·D_pos positional
# numbers, not one vector per offset ((2H − 1)(2W − 1) of them, about 4L; the paper's "quadratic" overstates it). We keep the 1/√D_h of Eq. 1 on the content term (Eq. 4 in the paper omits it;
# the official code scales the content scores). The positional scores do not depend on the image, so they are computed
# once, for all samples of the batch.

# %% [markdown]
# ### Your turn: Eq. 4
#
# Before this chapter shows its implementation, you write it. (How an exercise works, chapter 00_input_checks: replace
# the placeholder `...` in the answer cell, then run the check below it; a reference answer sits, collapsed, after the
# check.)
#
# **PSA, yours.** Write `my_psa(q, k, v, rel, v_pos)`: Eq. 4 for queries, keys and values (B, N_h, L, D_h), relative
# positions `rel` (L, L, 3) and one positional embedding per head `v_pos` (N_h, 3) — the content score q·k/√D_h and
# the positional score v_posᵀ r_ij summed, *then* one softmax over the keys — returning the output A·V. Compute the
# positional scores for all heads at once with `torch.einsum` or einops. The check compares your output with the
# package's `positional_self_attention` (`convit_edu.positional`), the function this chapter shows next.

# %%
my_psa = ...  # your answer: def my_psa(q, k, v, rel, v_pos): ...

# %%
from convit_edu.checks import check_answer, demonstrate, grade, reveal
from convit_edu.positional import positional_self_attention as package_psa  # Eq. 4, shown after this exercise


def check_my_psa(fn) -> None:
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 3, 12, 8, generator=g) for _ in range(3))
    rel, v_pos = rel_indices(3, 4), torch.randn(3, 3, generator=g)
    want = package_psa(q, k, v, rel, v_pos)[0]
    got = fn(q, k, v, rel, v_pos)
    check_answer(tuple(got.shape) == tuple(want.shape), f"the output is A·V, (B, N_h, L, D_h) = {tuple(want.shape)}, "
                 f"got {tuple(got.shape)}")
    unscaled = package_psa(q * 8**0.5, k, v, rel, v_pos)[0]  # content q·k, not q·k/√8
    check_answer(not torch.allclose(got, unscaled, atol=1e-5), "the content score is q·k/√D_h, scaled as in Eq. 1, "
                 "before the positional score is added")
    check_answer(not torch.allclose(got, two_softmaxes(q, k, v, rel, v_pos), atol=1e-5), "two softmaxes mixed is "
                 "Eq. 7, GPSA: PSA adds the content and the positional scores, then takes one softmax of the sum")
    check_answer(torch.allclose(got, want, atol=1e-5), "head h's positional score for query i and key j is v_pos[h] · "
                 "rel[i, j] (rel's first axis is the query's); it is added to the content score of (i, j)")


def two_softmaxes(q, k, v, rel, v_pos):  # a slip: a softmax of the content scores and one of the positional, averaged
    content = package_psa(q, k, v, rel, torch.zeros_like(v_pos))[1]  # v_pos = 0: the content scores alone
    position = package_psa(torch.zeros_like(q), k, v, rel, v_pos)[1]  # q = 0: the positional scores alone
    return (content + position) / 2 @ v


grade("my_psa", my_psa, check_my_psa)
demonstrate(check_my_psa, {
    "A returned, not A·V": lambda q, k, v, rel, v_pos: package_psa(q, k, v, rel, v_pos)[1],
    "no 1/√D_h": lambda q, k, v, rel, v_pos: package_psa(q * q.shape[-1] ** 0.5, k, v, rel, v_pos)[0],
    "two softmaxes": two_softmaxes,
    "rel read as (key, query)": lambda q, k, v, rel, v_pos: package_psa(q, k, v, rel.transpose(0, 1), v_pos)[0],
})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(my_psa):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def my_psa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rel: torch.Tensor, v_pos: torch.Tensor):
        content = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5  # (B, N_h, L, L)
        position = torch.einsum("ijp,hp->hij", rel, v_pos)  # (N_h, L, L): the same for every image
        return (content + position).softmax(dim=-1) @ v

    grade("my_psa", my_psa, check_my_psa)

# %% [markdown]
# Here is the package's version of what you wrote, with the shapes checked before any work (the chapters after this
# one use it, and the modules built on it, not your `my_psa`):

# %%
#| export
def positional_self_attention(
    q: Tensor, k: Tensor, v: Tensor, rel: Tensor, v_pos: Tensor
) -> tuple[Tensor, Tensor]:
    """Positional self-attention, Eq. 4: content and positional scores summed before one softmax.

    ``q, k, v``: (B, N_h, L, D_h); ``rel``: (L, L, D_pos), e.g. ``rel_indices(H, W)``; ``v_pos``: (N_h, D_pos),
    one positional embedding per head. Returns the output A·V, (B, N_h, L, D_h), and A, (B, N_h, L, L).
    The (image-independent) positional scores are computed once and broadcast over the batch.
    """
    if q.ndim != 4 or k.shape != q.shape or v.shape != q.shape:
        raise ValueError(
            f"q, k, v must share one shape (B, N_h, L, D_h), got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    _, heads, length, head_dim = q.shape
    if rel.ndim != 3 or rel.shape[:2] != (length, length):
        raise ValueError(f"rel must have shape (L, L, D_pos) with L={length} tokens, got {tuple(rel.shape)}")
    if v_pos.shape != (heads, rel.shape[-1]):
        raise ValueError(
            f"v_pos must have shape (N_h, D_pos) = ({heads}, {rel.shape[-1]}), got {tuple(v_pos.shape)}"
        )
    content = q @ k.transpose(-2, -1) * head_dim**-0.5
    position = torch.einsum("qkp,hp->hqk", rel, v_pos)
    attn = (content + position).softmax(dim=-1)
    return attn @ v, attn


# %% [markdown]
# ### PSA can attend to a place
#
# Pick an offset Δ and a strength α and set v_pos = α·(2Δx, 2Δy, −1) in our channel order. Then
# v_pos · r_δ = α(2Δ·δ − ‖δ‖²) = −α‖δ − Δ‖² + α‖Δ‖², and the constant α‖Δ‖² drops out of the softmax: with no
# content (Q = 0), the head puts a blob of attention around the key at offset Δ from every query, sharper as
# α grows. This is Eq. 5, the subject of chapter 03; here we check the algebra and look at it on the 5×7
# grid, for one head looking one patch to the right and one looking one patch up.

# %%
alpha = 1.0
centres = torch.tensor([[1.0, 0.0], [0.0, -1.0]])  # Δ = (Δx, Δy) per head: right, up
v_pos = alpha * torch.cat([2 * centres, -torch.ones(2, 1)], dim=1)
print("v_pos", v_pos, sep="\n")

B, Dh = 1, 4
zeros = torch.zeros(B, 2, H * W, Dh)
_, attn_pos = positional_self_attention(zeros, zeros, torch.randn(B, 2, H * W, Dh), rel57, v_pos)
dist2 = ((rel57[None, :, :, :2] - centres[:, None, None, :]) ** 2).sum(-1)  # ‖δ − Δ_h‖², (N_h, L, L)
torch.testing.assert_close(attn_pos[0], (-alpha * dist2).softmax(-1))
print("head 0 attends most to key", attn_pos[0, 0, q].argmax().item(), "= query", q, "+ 1 (right)")
print("head 1 attends most to key", attn_pos[0, 1, q].argmax().item(), "= query", q, f"- {W} (up)")
assert attn_pos[0, 0, q].argmax() == q + 1 and attn_pos[0, 1, q].argmax() == q - W

# %%
fig, axes = plt.subplots(1, 2, figsize=(6, 2.2), dpi=90)
for h, (ax, title) in enumerate(zip(axes, ["head 0: Δ = (1, 0)", "head 1: Δ = (0, −1)"])):
    ax.imshow(attn_pos[0, h, q].reshape(H, W), cmap="magma")
    ax.plot(q_col, q_row, "cx", markersize=10)
    ax.set_title(title, fontsize=9)
    ax.set_xticks([]), ax.set_yticks([])
fig.suptitle(f"PSA attention of query {q} (×), content switched off, α = {alpha}", fontsize=10)
plt.tight_layout()
plt.show()

# %% [markdown]
# ### One softmax for two kinds of evidence
#
# Because content and position share one softmax, whichever scores are larger dominate. With α = 1 a
# moderate content signal still moves the attention; with a large α the positional term swamps it, and the
# head attends where it is told regardless of the image. This is the limitation that App. A of the paper
# observes in training (a PSA-ConViT "stays in the convolutional configuration and ignores the content") and
# that GPSA (chapter 05) removes by giving content and position separate softmaxes and a learned gate. We
# measure how far content moves the attention away from the purely positional map (total variation distance,
# averaged over queries), for the same random queries and keys at growing α:

# %%
_ = torch.manual_seed(0)
qc, kc = torch.randn(2, B, 2, H * W, 16).unbind(0)
vc = torch.randn(B, 2, H * W, 16)
shift = {}
for a in [0.1, 1.0, 10.0]:
    _, with_content = positional_self_attention(qc, kc, vc, rel57, v_pos / alpha * a)
    _, position_only = positional_self_attention(torch.zeros_like(qc), kc, vc, rel57, v_pos / alpha * a)
    shift[a] = 0.5 * (with_content - position_only).abs().sum(-1).mean().item()
    print(f"alpha {a:5.1f}: content moves {shift[a]:.3f} of the attention mass")
assert shift[0.1] > shift[1.0] > shift[10.0]

# %% [markdown]
# ## Bad input
#
# A grid needs at least one row and one column; `rel_indices` says which size was wrong before building
# anything, and `positional_self_attention` checks that `rel` matches the number of tokens:

# %%
from convit_edu.checks import expect_error

for args in [(0, 7), (5, -1)]:
    print(f"rel_indices{args}:", expect_error(lambda: rel_indices(*args)))
print("positional_self_attention on a 6×6 grid for 35 tokens:",
      expect_error(lambda: positional_self_attention(qc, kc, vc, rel_indices(6, 6), v_pos)))

# %% [markdown]
# ## What we built
#
# * `grid_coordinates(H, W)`: (column, row) of every token, row-major;
# * `rel_indices(H, W)`: r_δ = (δx, δy, ‖δ‖²) for every (query, key) pair, δ = key − query, on any H×W grid;
# * `positional_self_attention`: Eq. 4, content and positional scores summed before one softmax.
#
# Chapter 03 chooses v_pos (Eq. 5); chapter 04 shows that N_h PSA heads so initialised compute a convolution.

# %% [markdown]
# ## Exercises
#
# Two more, as the one above: replace the placeholder `...` in the answer cell, then run the check below it.
#
# **1. One offset by hand.** On a grid of 3 rows × 4 columns, the query is the patch in row 0, column 0 and
# the key the patch in row 2, column 3. Without running `rel_indices`, write their r_δ = (δx, δy, ‖δ‖²) as a
# tuple `r_by_hand`.

# %%
r_by_hand = ...  # your answer: r_by_hand = (..., ..., ...)

# %%
def check_r_by_hand(answer: tuple) -> None:
    check_answer(len(answer) == 3, f"give three numbers, δx, δy and ‖δ‖², got {len(answer)}")
    rows, cols = 3, 4
    want_x, want_y, want_d2 = rel_indices(rows, cols)[0 * cols + 0, 2 * cols + 3].tolist()  # tokens row by row
    dx, dy, d2 = (float(a) for a in answer)
    check_answer((dx, dy) != (-want_x, -want_y), "δ is key − query, not query − key: the key lies below and to "
                 "the right of the query, so both offsets are positive")
    check_answer((dx, dy) != (want_y, want_x), "δx counts columns and δy rows: the first number is the column offset")
    check_answer((dx, dy) == (want_x, want_y), "δ = key − query: count the columns (δx) and the rows (δy) from the "
                 "query's patch to the key's")
    check_answer(d2 == want_d2, "the third number is the squared length ‖δ‖² = δx² + δy², not the length")


grade("r_by_hand", r_by_hand, check_r_by_hand)
demonstrate(check_r_by_hand, {"two numbers": (3, 2), "query − key": (-3, -2, 13), "(rows, columns)": (2, 3, 13),
                              "a column miscounted": (4, 2, 20), "the length, not its square": (3, 2, 13**0.5)})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(r_by_hand):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    r_by_hand = (3, 2, 13)  # δ = key − query: 3 columns right, 2 rows down
    grade("r_by_hand", r_by_hand, check_r_by_hand)

# %% [markdown]
# **2. A head that looks up.** Choose one head's positional embedding `v_up` (3 numbers, in `rel_indices`'
# channel order) so that a PSA head with no content scores puts at least half of its attention on the patch
# directly **above** the query (one row up, same column), for a query in the middle of a 5 × 5 grid. Hint for
# thinking it through: v_posᵀ r_δ = a·δx + b·δy + c·‖δ‖², and −α‖δ − Δ‖² expands into that form.

# %%
v_up = ...  # your answer: v_up = torch.tensor([..., ..., ...])

# %%
def check_v_up(v_pos: torch.Tensor) -> None:
    v_pos = torch.as_tensor(v_pos, dtype=torch.float32)
    check_answer(v_pos.numel() == 3, f"one weight per channel of r_δ = (δx, δy, ‖δ‖²): 3 numbers, got {v_pos.numel()}")
    middle = 2 * 5 + 2
    zeros = torch.zeros(1, 1, 25, 4)
    _, attn = positional_self_attention(zeros, zeros, zeros, rel_indices(5, 5), v_pos.reshape(1, 3))
    row = attn[0, 0, middle]
    key_row, key_col = divmod(int(row.argmax()), 5)  # the key it favours; the query is at row 2, column 2
    dx, dy = key_col - 2, key_row - 2
    check_answer((dx, dy) == (0, -1), f"the head looks most at δ = ({dx}, {dy}) (columns, rows; rows grow "
                 "downwards), not at (0, −1), the patch above: the first number weighs δx, the second δy")
    check_answer(float(row[middle - 5]) >= 0.5, f"it looks up but puts only {float(row[middle - 5]):.2f} there: "
                 "make the bump sharper (scale all three numbers up)")


grade("v_up", v_up, check_v_up)
demonstrate(check_v_up, {"two numbers": torch.tensor([0.0, -4.0]), "δy's sign flipped": torch.tensor([0.0, 4.0, -2.0]),
                         "(δy, δx) order": torch.tensor([-4.0, 0.0, -2.0]), "α too small": torch.tensor([0.0, -1.0, -0.5])})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(v_up):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    v_up = torch.tensor([0.0, -4.0, -2.0])  # = −2‖δ − (0, −1)‖² + const: a bump on δ = (0, −1), α = 2
    grade("v_up", v_up, check_v_up)
