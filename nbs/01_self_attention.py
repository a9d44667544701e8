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
# # Self-attention from scratch (Eq. 1-3) and the MHSA layer
#
# Every layer of a Vision Transformer, and the last two of a ConViT, is a multi-head self-attention (MHSA)
# layer. This chapter builds it in three steps, each checked against PyTorch's own implementation: scaled
# dot-product attention on three tokens you can follow by hand (Eq. 1), several heads at once with einops
# (Eq. 2-3), and a module that holds the layer's weights, which you write before the chapter shows `MHSA`, the
# package's, which the rest of the course uses. It ends with the property that motivates the whole paper:
# self-attention alone does not know where anything is.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp attention

# %%
import math

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## Eq. 1: scaled dot-product attention
#
# A sequence of L₁ queries Q ∈ R^{L₁×D_h} is matched against L₂ keys K ∈ R^{L₂×D_h} by inner products. Entry
# (i, j) of the attention matrix says how relevant key j is to query i:
#
# $$A = \operatorname{softmax}\!\left(\frac{QK^\top}{\sqrt{D_h}}\right) \in \mathbb{R}^{L_1\times L_2},
# \qquad \operatorname{softmax}(X)_{ij} = \frac{e^{X_{ij}}}{\sum_k e^{X_{ik}}} \qquad (1)$$
#
# and the output for query i is the A-weighted average of the values, (AV)_i = Σ_j A_ij V_j. Dividing by
# √D_h keeps the scores of order one when D_h grows (a dot product of D_h unit-variance terms has variance
# D_h), so the softmax does not saturate:

# %%
qs, ks = torch.randn(2, 10_000, 256).unbind(0)  # unit-variance entries, D_h = 256
dots = (qs * ks).sum(-1)
print(f"var(q·k) = {dots.var():.1f}, var(q·k / sqrt(D_h)) = {(dots / 16).var():.3f}")
se = 256 * (2 / (len(dots) - 1)) ** 0.5  # the standard error of a variance estimated from 10 000 draws: 3.6
assert abs(dots.var() - 256) < 4 * se and abs((dots / 16).var() - 1) < 4 * se / 256  # within 4 standard errors

# %% [markdown]
# Three tokens with D_h = 2, small enough to follow by hand:

# %%
Q = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
K = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])
V = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])

scores = Q @ K.T / Q.shape[-1] ** 0.5
A = scores.softmax(dim=-1)
print("Q", Q, "K", K, "scores = Q K^T / sqrt(2)", scores, "A", A, sep="\n")

# %% [markdown]
# Read row 0: query (1, 0) points the same way as key 0 and opposite to key 2, so its scores are (0.71, 0, −0.71) and A
# puts most weight on key 0. Query 1 = (0, 2) favours key 1, the only key it is not orthogonal to. Every row of A is a
# probability distribution over the keys (non-negative, sums to 1), and because V is the identity here, the output AV
# *is* A. Row 0 by hand: its scores are (1, 0, −1)/√2, so A[0] = (e^{0.71}, 1, e^{−0.71}) / their sum:

# %%
e = math.exp(2**-0.5)
torch.testing.assert_close(A[0], torch.tensor([e, 1.0, 1 / e]) / (e + 1 + 1 / e))
assert A[0].argmax() == 0 and A[1].argmax() == 1
torch.testing.assert_close(scores[0], torch.tensor([1.0, 0.0, -1.0]) / 2**0.5)

# %% [markdown]
# As a function, with batch and head dimensions in front (`...`), and checked against PyTorch's fused
# `F.scaled_dot_product_attention` (SDPA), which computes the same thing and whose fused kernels need not store A:

# %%
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 1: softmax(q k^T / sqrt(D_h)) v over the last two dims; returns (output, A)."""
    a = (q @ k.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(dim=-1)
    return a @ v, a


out, _ = attention(Q, K, V)
torch.testing.assert_close(out, F.scaled_dot_product_attention(Q[None], K[None], V[None])[0])

q, k, v = torch.randn(3, 2, 5, 7, 16).unbind(0)  # (batch 2, 5 "heads", 7 tokens, D_h 16), three times
out, a = attention(q, k, v)
torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
print("output", tuple(out.shape), "attention", tuple(a.shape))

# %% [markdown]
# ## Eq. 2-3: multi-head self-attention
#
# *Self*-attention matches a sequence with itself: queries, keys and values are three linear projections of
# the same L patch embeddings X ∈ R^{L×D_emb}. **Multi-head** SA runs N_h such heads side by side, each with its
# own projections W^h_qry, W^h_key, W^h_val ∈ R^{D_emb×D_h}, concatenates their outputs and mixes them with one
# output projection:
#
# $$\operatorname{MSA}(X) := \operatorname{concat}_{h\in[N_h]}\left[\mathrm{SA}_h(X)\right] W_{out} + b_{out},
# \qquad \mathrm{SA}_h(X) := A^h X W^h_{val} \qquad (2, 3)$$
#
# with A^h from Eq. 1 applied to Q^h = X W^h_qry and K^h = X W^h_key.
#
# ### `head_dim` and `embed_dim`
#
# Two widths appear, and this course always gives them these two names: **`embed_dim`** = D_emb, the width of
# a token between layers, and **`head_dim`** = D_h, the width of one head's queries, keys and values, with
# `embed_dim = num_heads * head_dim`. DeiT-Ti uses 3 heads of 64 for embed_dim 192; ConViT-Ti uses 4 heads of 48
# for the same 192. (The official ConViT code passes one of them under the other's name in places, which broke
# checkpoint loading for its users; here a name means one thing everywhere.)
#
# In practice all heads' projections are stacked into one matrix: a single Linear(D_emb → 3·D_emb), `qkv`,
# computes every head's q, k and v at once, and einops splits its output — this reshape is the whole trick of
# multi-head attention, so we spell it out:

# %%
B, L, D, heads = 2, 5, 12, 3
x = torch.randn(B, L, D)
qkv_layer, proj_layer = nn.Linear(D, 3 * D), nn.Linear(D, D)

qkv = qkv_layer(x)  # (B, L, 3·D): [q of head 0..N_h-1 | k of ... | v of ...]
q, k, v = rearrange(qkv, "b l (three h d) -> three b h l d", three=3, h=heads)
print("qkv", tuple(qkv.shape), "-> q, k, v", tuple(q.shape), "(batch, head, token, head_dim)")

# %% [markdown]
# Head h's query is columns h·D_h … (h+1)·D_h − 1 of the first third of `qkv`, i.e. X times the matching rows
# of the weight: W^h_qry is a block of `qkv.weight`. The concat of Eq. 2 is the inverse reshape.

# %%
head_dim = D // heads
h = 1
w_qry_h = qkv_layer.weight[h * head_dim : (h + 1) * head_dim]
torch.testing.assert_close(q[:, h], x @ w_qry_h.T + qkv_layer.bias[h * head_dim : (h + 1) * head_dim])


def multi_head_self_attention(x: torch.Tensor, qkv: nn.Linear, proj: nn.Linear, heads: int) -> torch.Tensor:
    """Eq. 2-3 with every head's projections stacked in ``qkv``; x: (B, L, D_emb)."""
    q, k, v = rearrange(qkv(x), "b l (three h d) -> three b h l d", three=3, h=heads)
    out, _ = attention(q, k, v)  # SA_h(X) = A^h X W^h_val for every head at once
    return proj(rearrange(out, "b h l d -> b l (h d)"))  # concat over heads, then W_out, b_out


y = multi_head_self_attention(x, qkv_layer, proj_layer, heads)
print("y", tuple(y.shape))

# %% [markdown]
# PyTorch's `nn.MultiheadAttention` implements the same equations with the same layout: `in_proj_weight` stacks
# the query, key and value projections, each split into heads along its rows. Copying our weights into it must
# give our output and, per head, our attention maps:

# %%
torch_mha = nn.MultiheadAttention(D, heads, batch_first=True)
with torch.no_grad():
    torch_mha.in_proj_weight.copy_(qkv_layer.weight)
    torch_mha.in_proj_bias.copy_(qkv_layer.bias)
    torch_mha.out_proj.weight.copy_(proj_layer.weight)
    torch_mha.out_proj.bias.copy_(proj_layer.bias)
y_torch, a_torch = torch_mha(x, x, x, need_weights=True, average_attn_weights=False)
torch.testing.assert_close(y, y_torch)
_, a = attention(*rearrange(qkv_layer(x), "b l (three h d) -> three b h l d", three=3, h=heads))
torch.testing.assert_close(a, a_torch)
print("matches nn.MultiheadAttention: output", tuple(y_torch.shape), "attention", tuple(a_torch.shape))

# %% [markdown]
# ## Your turn: the layer as a module
#
# The function above is the whole of multi-head self-attention, but a model holds its layers' weights: before this
# chapter shows the package's `MHSA`, you write it. (How an exercise works, chapter 00_input_checks: replace the
# placeholder `...` in the answer cell, then run the check below it; a reference answer sits, collapsed, after the
# check.)
#
# **The attention module, yours.** Write a module `MyMHSA(embed_dim, num_heads)`: multi-head self-attention
# (Eq. 1-3) with two linear maps named as the official checkpoints name them, `qkv` (D → 3D, with bias) and `proj`
# (D → D), so that a checkpoint's weights load into it (`load_state_dict`); `forward(x)` maps (B, L, D) to (B, L, D).
# Split the heads with einops and compute the attention yourself, as `attention` does (no
# `scaled_dot_product_attention`). The check loads the same random weights into your module and into the two layers
# of `multi_head_self_attention` above, and compares their outputs.

# %%
MyMHSA = ...  # your answer: class MyMHSA(nn.Module): ...

# %%
from convit_edu.checks import check_answer, demonstrate, grade, reveal


def check_my_mhsa(cls) -> None:
    torch.manual_seed(0)
    for dim, heads in ((48, 4), (36, 3)):
        layers = nn.ModuleDict({"qkv": nn.Linear(dim, 3 * dim), "proj": nn.Linear(dim, dim)})  # a checkpoint's names
        yours = cls(dim, heads)
        check_answer(set(yours.state_dict()) == set(layers.state_dict()), "the parameters should be qkv.weight, "
                     f"qkv.bias, proj.weight and proj.bias, got {sorted(yours.state_dict())}")
        yours.load_state_dict(layers.state_dict())
        x = torch.randn(2, 7, dim)
        with torch.no_grad():
            out, want = yours(x), multi_head_self_attention(x, layers.qkv, layers.proj, heads)  # Eq. 2-3, built above
            q, k, v = rearrange(layers.qkv(x), "b l (three h d) -> three b h l d", three=3, h=heads)
            unscaled = layers.proj(rearrange((q @ k.transpose(-2, -1)).softmax(-1) @ v, "b h l d -> b l (h d)"))
            q, k, v = rearrange(layers.qkv(x), "b l (h three d) -> three b h l d", three=3, h=heads)
            interleaved = layers.proj(rearrange(attention(q, k, v)[0], "b h l d -> b l (h d)"))
        check_answer(not torch.allclose(out, unscaled, atol=1e-5), f"{heads} heads of width {dim // heads}: the "
                     "scores are not scaled: divide each head's q·k by √head_dim before its softmax")
        check_answer(not torch.allclose(out, interleaved, atol=1e-5), f"{heads} heads: qkv's output is split the wrong "
                     "way: it is (q, k, v) one after the other, each split into heads of consecutive channels")
        error = (out - want).abs().max().item()
        check_answer(error < 1e-5, f"{heads} heads of width {dim // heads}: your output differs by up to {error:.2f}: "
                     "each head's softmax runs over the keys (the last axis), then A·V, the heads concatenated, proj")


class Slip(nn.Module):
    """MyMHSA's parameters, and a forward that makes the slip its subclass names: wrong answers to show the check."""

    bias = True  # whether qkv has a bias
    split = "(three h d)"  # how qkv's output is cut into q, k and v of each head
    scale = True  # whether the scores are divided by √head_dim
    softmax_over = -1  # the axis of the scores the softmax normalises

    def __init__(self, embed_dim: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads, self.proj = num_heads, nn.Linear(embed_dim, embed_dim)
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = rearrange(self.qkv(x), f"b l {self.split} -> three b h l d", three=3, h=self.num_heads)
        scores = q @ k.transpose(-2, -1) / (q.shape[-1] ** 0.5 if self.scale else 1)
        return self.proj(rearrange(scores.softmax(self.softmax_over) @ v, "b h l d -> b l (h d)"))


grade("MyMHSA", MyMHSA, check_my_mhsa)
demonstrate(check_my_mhsa, {"qkv without its bias": type("NoBias", (Slip,), dict(bias=False)),
                            "no 1/√head_dim": type("Unscaled", (Slip,), dict(scale=False)),
                            "qkv split as (h three d)": type("Interleaved", (Slip,), dict(split="(h three d)")),
                            "the softmax over the queries": type("OverQueries", (Slip,), dict(softmax_over=-2))})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(MyMHSA):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    class MyMHSA(nn.Module):
        def __init__(self, embed_dim: int, num_heads: int) -> None:
            super().__init__()
            self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
            self.qkv, self.proj = nn.Linear(embed_dim, 3 * embed_dim), nn.Linear(embed_dim, embed_dim)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = rearrange(self.qkv(x), "b l (three h d) -> three b h l d", three=3, h=self.num_heads)
            attn = (q @ k.transpose(-2, -1) / self.head_dim**0.5).softmax(dim=-1)
            return self.proj(rearrange(attn @ v, "b h l d -> b l (h d)"))

    grade("MyMHSA", MyMHSA, check_my_mhsa)

# %% [markdown]
# ## The `MHSA` module
#
# Here is the package's version of what you wrote: the layer that DeiT uses everywhere and the ConViT in its last two
# blocks. Its two layers and its reshapes are `MyMHSA`'s, with these choices and additions:
#
# * `qkv`: Linear(embed_dim → 3·embed_dim), with a bias only if `qkv_bias` (DeiT: yes; ConViT: no);
# * `proj`: the output projection W_out, b_out of Eq. 2;
# * dropout on the attention weights (`attn_drop`) and on the output (`proj_drop`), 0 in the paper's recipes;
# * a fast path: unless you ask for the attention map, it calls SDPA, whose fused kernels never store the
#   (B, N_h, L, L) matrix (its plain-PyTorch fallback does), and which picks the fastest kernel for the hardware
#   (FlashAttention on recent GPUs), with the attention dropout done inside SDPA (`dropout_p`) in training.
#   `fused_attention` wraps it: on a CPU it attends in fp32 even when the rest computes in bf16 (chapter 20);
# * `return_attention=True` materialises A as in Eq. 1 and returns it with the output, for the analyses of
#   chapters 33-34. The map returned is the softmax of Eq. 1 (rows sum to 1); in training the values are mixed with a
#   dropped-out copy of it.
#
# Names and layout (`qkv`, `proj`, q|k|v stacked, heads contiguous inside each) are those of DeiT and ConViT
# checkpoints, so their weights load without renaming.

# %%
#| export
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn


def fused_attention(q: Tensor, k: Tensor, v: Tensor, attn_mask: Tensor | None = None, dropout_p: float = 0.0) -> Tensor:
    """Eq. 1 for every head by ``F.scaled_dot_product_attention``; on a CPU in bf16 or fp16 (inputs or autocast)
    attended in fp32 and cast back, because there its bf16 kernel took 2-7 times as long as fp32 (chapter 20)."""
    if q.device.type == "cpu" and (q.dtype in (torch.bfloat16, torch.float16) or torch.is_autocast_enabled("cpu")):
        mask = attn_mask.float() if attn_mask is not None and attn_mask.is_floating_point() else attn_mask
        with torch.autocast("cpu", enabled=False):
            return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), mask, dropout_p).to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)


class MHSA(nn.Module):
    """Multi-head self-attention, Eq. 1-3: ``concat_h[softmax(Q_h K_h^T / sqrt(head_dim)) V_h] W_out + b_out``.

    ``embed_dim`` is the token width D_emb, split into ``num_heads`` heads of ``head_dim = embed_dim //
    num_heads``. ``forward(x)`` runs through ``fused_attention`` (SDPA), whose fused kernels do not store the
    attention matrix; ``forward(x, return_attention=True)`` computes it explicitly and returns
    ``(y, attn)`` with ``attn`` of shape (B, num_heads, L, L), the softmax of Eq. 1 before attention dropout.
    """

    def __init__(
        self, embed_dim: int, num_heads: int, qkv_bias: bool = False, attn_drop: float = 0.0, proj_drop: float = 0.0
    ) -> None:
        super().__init__()
        if num_heads < 1:
            raise ValueError(f"num_heads must be at least 1, got {num_heads}")
        if embed_dim < 1 or embed_dim % num_heads:
            raise ValueError(
                f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}: "
                f"embed_dim must be a positive multiple of num_heads (embed_dim = num_heads * head_dim)"
            )
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=qkv_bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, return_attention: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        if x.ndim != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(
                f"MHSA expects x of shape (batch, tokens, embed_dim={self.embed_dim}), got {tuple(x.shape)}"
            )
        q, k, v = rearrange(self.qkv(x), "b l (three h d) -> three b h l d", three=3, h=self.num_heads)
        if return_attention:
            attn = (q @ k.transpose(-2, -1) * self.head_dim**-0.5).softmax(dim=-1)
            out = self.attn_drop(attn) @ v
        else:
            out = fused_attention(q, k, v, dropout_p=self.attn_drop.p if self.training else 0.0)
        y = self.proj_drop(self.proj(rearrange(out, "b h l d -> b l (h d)")))
        return (y, attn) if return_attention else y


# %% [markdown]
# ### Checks
#
# `MHSA` with the weights of our from-scratch layer computes the same function, on both paths, and its attention
# rows sum to 1:

# %%
mhsa = MHSA(D, heads, qkv_bias=True).eval()
mhsa.load_state_dict({"qkv.weight": qkv_layer.weight, "qkv.bias": qkv_layer.bias,
                      "proj.weight": proj_layer.weight, "proj.bias": proj_layer.bias})
y_fast = mhsa(x)
y_slow, attn = mhsa(x, return_attention=True)
torch.testing.assert_close(y_fast, y)
torch.testing.assert_close(y_slow, y)
torch.testing.assert_close(attn, a_torch)
print("embed_dim", mhsa.embed_dim, "num_heads", mhsa.num_heads, "head_dim", mhsa.head_dim)

# %% [markdown]
# One MHSA layer of ConViT-Ti or DeiT-Ti (embed_dim 192) has 4·192² weights in `qkv` and `proj` plus the 192
# biases of `proj`: 147,648 parameters, whatever the number of heads; DeiT adds the 576 biases of `qkv`.

# %%
def n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


assert n_params(MHSA(192, 4)) == n_params(MHSA(192, 3)) == 4 * 192**2 + 192 == 147_648
assert n_params(MHSA(192, 3, qkv_bias=True)) == 147_648 + 576
print(f"MHSA(192, 4): {n_params(MHSA(192, 4)):,} parameters; with qkv bias {n_params(MHSA(192, 3, qkv_bias=True)):,}")

# %% [markdown]
# **Dropout** is only active in training: there, two calls give different outputs, but dropping weights with
# probability p and scaling the rest by 1/(1 − p) leaves the *average* unchanged, so over many draws the
# training-mode output approaches the evaluation-mode one (here 4000 copies of one sequence in a batch):

# %%
_ = torch.manual_seed(0)
drop = MHSA(8, 2, attn_drop=0.5)
x1 = torch.randn(1, 4, 8)
y_eval = drop.eval()(x1)
torch.testing.assert_close(drop(x1), y_eval)
drop.train()
for return_attention in (False, True):
    y_train = drop(x1.expand(4000, -1, -1), return_attention=return_attention)
    y_train = y_train[0] if return_attention else y_train
    assert not torch.allclose(y_train[0], y_train[1])
    torch.testing.assert_close(y_train.mean(0, keepdim=True), y_eval, atol=0.02, rtol=0)
    print(f"return_attention={return_attention}: samples differ, their mean is within 0.02 of the eval output")

# %% [markdown]
# The fast path is also the cheap one: the materialised path stores a (B, N_h, L, L) matrix per layer, N_h·L²
# numbers per image against the L·D_emb of the layer's input, N_h·L/D_emb times as many. For DeiT-S at 224 px
# (6 heads, 197 tokens of width 384) that is 6·197/384 ≈ 3.1 times the input, and the ratio grows with L, i.e. with
# the resolution. The sizes, read from the matrix the layer returns (one score per head, query and key):

# %%
tokens = torch.randn(1, 197, 384)
with torch.no_grad():
    _, attn = MHSA(384, 6)(tokens, return_attention=True)
assert attn.shape == (1, 6, 197, 197)  # every head's map, not their average
attn_floats, token_floats = attn[0].numel(), tokens[0].numel()
print(f"per image, fp32: attention {attn_floats * 4 / 1e6:.2f} MB, tokens {token_floats * 4 / 1e6:.2f} MB: "
      f"{attn_floats / token_floats:.2f} times, N_h·L/D_emb")

# %% [markdown]
# ## Self-attention knows no positions
#
# Shuffle the tokens of the input with a permutation π. Every score q_i·k_j is computed from token contents
# only, so the shuffled input gives the shuffled output, and the attention matrix is shuffled along both axes:
#
# $$\mathrm{MHSA}(X_{\pi}) = \mathrm{MHSA}(X)_{\pi}, \qquad A(X_\pi)_{ij} = A(X)_{\pi(i)\pi(j)} .$$
#
# SA is **permutation-equivariant**: a layer of it cannot tell whether a patch was in the corner or in the
# centre of the image, or whether two patches were neighbours. An image is not a bag of patches, and this is
# why ViT adds positional embeddings to its input and why the ConViT gives attention *relative* positions
# (chapter 02).

# %%
_ = torch.manual_seed(1)
mhsa = MHSA(32, 4).eval()
x = torch.randn(1, 9, 32)
perm = torch.randperm(9)
with torch.no_grad():
    y, attn = mhsa(x, return_attention=True)
    y_perm, attn_perm = mhsa(x[:, perm], return_attention=True)
torch.testing.assert_close(y_perm, y[:, perm])
torch.testing.assert_close(attn_perm, attn[:, :, perm][:, :, :, perm])
print("permutation", perm.tolist())

# %%
inverse = perm.argsort()
fig, axes = plt.subplots(1, 3, figsize=(8, 2.6), dpi=90)
panels = [
    (attn[0, 0], "A(X), head 0"),
    (attn_perm[0, 0], "A(X shuffled)"),
    (attn_perm[0, 0][inverse][:, inverse], "A(X shuffled), unshuffled"),
]
for ax, (img, title) in zip(axes, panels):
    ax.imshow(img, cmap="magma", vmin=0, vmax=attn[0, 0].max())
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("key"), ax.set_ylabel("query")
    ax.set_xticks(range(0, 9, 2)), ax.set_yticks(range(0, 9, 2))
plt.tight_layout()
plt.show()

# %% [markdown]
# ## Bad input
#
# Errors are raised before any computation and name the wrong value:

# %%
from convit_edu.checks import expect_error

print(expect_error(lambda: MHSA(100, 3)))
print(expect_error(lambda: MHSA(192, 0)))
for shape in [(197, 192), (2, 197, 96)]:
    print(expect_error(lambda: MHSA(192, 3)(torch.zeros(shape))))

# %% [markdown]
# ## What we built
#
# * Eq. 1 as five lines, equal to `F.scaled_dot_product_attention`;
# * Eq. 2-3 as an einops reshape around it, equal to `nn.MultiheadAttention` with the same weights, and your
#   `MyMHSA`, the same as a module;
# * `convit_edu.attention.MHSA(embed_dim, num_heads, qkv_bias, attn_drop, proj_drop)`: SDPA by default,
#   attention maps on request, checkpoint-compatible names;
# * the reason for the next chapter: SA is permutation-equivariant and needs to be told where patches are.

# %% [markdown]
# ## Exercises
#
# Two more, as the one above: replace the placeholder `...` in the answer cell, then run the check below it. What you
# write stays in this notebook: the chapters after this one use the package's `MHSA`, not your `MyMHSA`.
#
# **1. Masked attention.** Write `masked_attention(q, k, v, mask)` for tensors (..., L, d) and a boolean
# `mask` (L, L) where `True` means "query i may look at key j": Eq. 1 with the forbidden scores set to −∞
# before the softmax. (Causal language models use exactly this; `F.scaled_dot_product_attention` takes the
# same mask as `attn_mask`.)

# %%
masked_attention = ...  # your answer: def masked_attention(q, k, v, mask): ...

# %%
def check_masked_attention(fn) -> None:
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 3, 6, 8, generator=g) for _ in range(3))
    near = torch.arange(6)
    mask = (near[:, None] - near[None, :]).abs() <= 1  # each query sees itself and its two neighbours
    out = fn(q, k, v, mask)
    check_answer(tuple(out.shape) == (2, 3, 6, 8), f"the output is A·V, with v's shape (2, 3, 6, 8), got "
                 f"{tuple(out.shape)}")
    scores = q @ k.transpose(-2, -1)

    def like(other: torch.Tensor) -> bool:
        return torch.allclose(out, other, atol=1e-5, equal_nan=True)

    check_answer(not like((scores / 8**0.5).softmax(-1) * mask @ v), "the mask is applied after the softmax: zeroing "
                 "the forbidden weights leaves rows that do not sum to 1; set the forbidden scores to -inf before it")
    check_answer(not like(scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v), "the scores are not scaled: "
                 "divide q·k by √d, as Eq. 1 does, before the softmax")
    check_answer(not like((scores / 8**0.5).masked_fill(mask, float("-inf")).softmax(-1) @ v), "the mask is read "
                 "backwards: True means the query *may* look at the key, so fill the scores where the mask is False")
    check_answer(like(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)), "your output differs from Eq. 1 "
                 "with the forbidden scores at -inf: softmax(q·kᵀ/√d) over the keys of each query, then times v")


grade("masked_attention", masked_attention, check_masked_attention)
demonstrate(check_masked_attention, {
    "the attention matrix returned, not A·V": lambda q, k, v, mask: attention(q, k, v)[1],
    "the mask after the softmax": lambda q, k, v, mask: attention(q, k, v)[1] * mask @ v,
    "no 1/√d": lambda q, k, v, mask: (q @ k.transpose(-2, -1)).masked_fill(~mask, float("-inf")).softmax(-1) @ v,
    "the mask read backwards": lambda q, k, v, mask: F.scaled_dot_product_attention(q, k, v, attn_mask=~mask),
    "no mask at all": lambda q, k, v, mask: attention(q, k, v)[0],
})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(masked_attention):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
        return scores.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v

    grade("masked_attention", masked_attention, check_masked_attention)

# %% [markdown]
# **2. Splitting heads with einops.** Write `split_heads(x, num_heads)`: (B, L, D) → (B, N_h, L, D/N_h), head h
# taking channels h·D/N_h … (h+1)·D/N_h − 1, the layout `MHSA` uses.

# %%
split_heads = ...  # your answer: def split_heads(x, num_heads): ...

# %%
def check_split_heads(fn) -> None:
    x = torch.arange(2 * 5 * 12.0).reshape(2, 5, 12)
    out = fn(x, 3)
    check_answer(tuple(out.shape) == (2, 3, 5, 4), f"expected shape (2, 3, 5, 4), heads before the tokens, got "
                 f"{tuple(out.shape)}")
    check_answer(torch.equal(out[1, 2, 4], x[1, 4, 8:12]), "head 2 of token 4 should hold channels 8..11 of that "
                 "token, consecutive: split the last axis as (heads, head_dim), heads first — (d h) deals the "
                 "channels out to the heads in turn")


grade("split_heads", split_heads, check_split_heads)
demonstrate(check_split_heads, {
    "the heads left after the tokens": lambda x, h: rearrange(x, "b l (h d) -> b l h d", h=h),
    "(d h) instead of (h d)": lambda x, h: rearrange(x, "b l (d h) -> b h l d", h=h),
})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(split_heads):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
        return rearrange(x, "b l (h d) -> b h l d", h=num_heads)

    grade("split_heads", split_heads, check_split_heads)
