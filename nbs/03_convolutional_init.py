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
# # Convolutional initialisation: head centres, locality strength, and PSA = convolution
#
# Chapter 02 gave every (query, key) pair its relative position r_δ = (δx, δy, ‖δ‖²) and added a positional
# score v_posᵀ r_δ to the content score (Eq. 4). This chapter chooses v_pos so that each head looks at one
# offset of a convolution kernel (Eq. 5), draws the attention maps of Fig. 3 on a real image, and then proves,
# by running it, the result the whole paper builds on (Cordonnier et al., 2019): a positional self-attention
# layer with N_h = k² heads computes any k×k convolution — with as many output channels as a head is wide
# (min(D_h, D_out)). That condition matters: a ConViT layer's heads are narrow (D_h = D/N_h), and the last
# section shows the narrower operation such a layer computes at initialization.

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
# a discrete Gaussian **centred at the offset Δ_h** with variance 1/(2α) per axis. Δ_h is *where* the head
# looks, α (`locality_strength`) *how sharply*. The same reasoning says the bias of `pos_proj` (one constant
# per head) never changes the attention.
#
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
# block. (The caption of Fig. 3 lists the 4 centres as (±1, ±1); the official code, with which the
# checkpoints were trained, uses (±½, ±½), and so do we.) For an *exact* even convolution the centres must
# be moved by half a patch onto integer offsets — that is what the proof at the end of this chapter does.
#
# **N_h not a perfect square.** 6 heads give k = 2: four local heads, and two heads with no place on the
# kernel. The official code leaves those two with their random positional weights, so they start almost
# uniform over the image. `head_centres` reports them as NaN rows and warns — once, through Python's
# `warnings`, so a 10-layer model does not print it ten times.

# %%
#| export
import math
import warnings

import torch
from torch import Tensor, nn


def check_locality_strength(locality_strength: float) -> float:
    """α as a float, or a ValueError: Eq. 5 needs α > 0 (α ≤ 0 attends *away* from the centre, or uniformly).

    The one rule for α, shared by ``local_init`` and ``ModelConfig`` (chapter 05)."""
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
def positional_attention(pos_proj: nn.Linear, height: int, width: int) -> torch.Tensor:
    """Softmax over keys of the positional scores, (N_h, L, L): the attention of W_qry = W_key = 0."""
    return rearrange(pos_proj(rel_indices(height, width)).softmax(dim=1), "q k h -> h q k")


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
# The claims of the caption, checked: the SA maps change with the image (here, the image flipped left-right),
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
# ## Proof by execution: a PSA layer with k² heads *is* a k×k convolution
#
# Cordonnier et al. (2019, Theorem 1) prove that multi-head self-attention with N_h heads of width D_h, output
# width D_out and relative positional encodings (D_pos ≥ 3) can express any √N_h × √N_h convolution with
# min(D_h, D_out) output channels. Every head must carry enough channels for the whole kernel tap it applies;
# `ConvAsPSA` meets the condition by making each head as wide as the input (D_h = C_in, so the value
# projection has N_h · C_in outputs). The construction is Eq. 5 with one head per kernel tap:
#
# * the tokens are the pixels of the (zero-padded) input, so L = H·W and the features are the C_in channels;
# * W_qry = W_key = 0, so the content score is 0 and the attention is the positional softmax alone;
# * head h attends to offset Δ_h; as α → ∞ its attention becomes one-hot on the pixel query + Δ_h;
# * W_val copies the C_in channels into each head (D_h = C_in), and the output projection multiplies head h
#   by the kernel tap W[:, :, i, j] that sits at offset Δ_h, then adds the bias.
#
# Summed over heads, the output at the query is Σ_h W_{tap h} · x(query + Δ_h) + b: the convolution.
#
# Which query is the output pixel? `nn.Conv2d` computes output (r, s) from input rows r … r + k − 1 and columns
# s … s + k − 1 of the padded input. For odd k we take the middle pixel (r + c, s + c) as the query, and the
# offsets are exactly `head_centres(k²)`. For even k there is no middle pixel: we anchor the query at
# (r + a, s + a) with a = ⌊(k − 1)/2⌋, which moves the half-integer centres of the ConViT by +½ onto integer
# offsets — for k = 2 the taps are at Δ ∈ {0, 1}². With the ConViT's own (±½, ±½) centres each head would
# average four pixels (shown below), and no choice of weights gives a general 2×2 convolution.

# %%
#| export
from einops import rearrange
from torch.nn import functional as F

from convit_edu.positional import rel_indices


class ConvAsPSA(nn.Module):
    """A positional self-attention layer (Eq. 4-5, W_qry = W_key = 0) computing a given k×k convolution.

    Cordonnier et al. (2019): one head per kernel tap, centred at that tap's offset; ``v`` copies the input
    channels into every head (D_h = C_in), ``proj`` holds the taps of ``conv.weight`` and ``conv.bias``. The
    output approaches ``conv(images)`` as ``locality_strength`` (α) grows (error ~ e^{−α}). For even k the
    query is the pixel ⌊(k − 1)/2⌋ from the window's top-left corner, so every centre is an integer offset.
    Its heads are as wide as the input (N_h · C_in value channels): a ConViT layer's are not (D_h = D/N_h).
    """

    def __init__(self, conv: nn.Conv2d, locality_strength: float):
        super().__init__()
        alpha = check_locality_strength(locality_strength)
        k = conv.kernel_size[0]
        problems = {
            "kernel_size": (conv.kernel_size, (k, k)),
            "stride": (conv.stride, (1, 1)),
            "dilation": (conv.dilation, (1, 1)),
            "groups": (conv.groups, 1),
            "padding_mode": (conv.padding_mode, "zeros"),
        }
        for name, (value, wanted) in problems.items():
            if value != wanted:
                raise ValueError(
                    f"ConvAsPSA needs a square, dense, stride-1 convolution: conv.{name} is {value!r}, not {wanted!r}"
                )
        if isinstance(conv.padding, str):
            raise ValueError(f"ConvAsPSA needs a numeric conv.padding, got {conv.padding!r}")
        num_heads, c_in = k * k, conv.in_channels
        self.kernel_size, self.padding, self.num_heads = k, tuple(conv.padding), num_heads
        self.anchor = (k - 1) // 2
        h = torch.arange(num_heads)
        taps = torch.stack([h // k, h % k], dim=-1)  # (column, row) of head h = h1 + k·h2, as in head_centres
        self.register_buffer("centres", (taps - self.anchor).to(torch.float32), persistent=False)
        self.pos_proj = nn.Linear(3, num_heads)
        self.v = nn.Linear(c_in, num_heads * c_in, bias=False)
        self.proj = nn.Linear(num_heads * c_in, conv.out_channels)
        with torch.no_grad():
            self.pos_proj.weight.copy_(v_pos(self.centres, alpha))
            self.pos_proj.bias.zero_()
            self.v.weight.copy_(torch.eye(c_in).repeat(num_heads, 1))
            self.proj.weight.copy_(rearrange(conv.weight, "o c i j -> o (j i c)"))  # head index i + k·j
            self.proj.bias.copy_(conv.bias if conv.bias is not None else torch.zeros(conv.out_channels))

    def forward(self, images: Tensor) -> Tensor:
        """(B, C_in, H, W) -> (B, C_out, H_out, W_out), the shape ``conv(images)`` has."""
        k, (ph, pw), a = self.kernel_size, self.padding, self.anchor
        if images.ndim != 4 or images.shape[1] * self.num_heads != self.v.out_features:
            raise ValueError(
                f"expected images (B, {self.v.out_features // self.num_heads}, H, W), got {tuple(images.shape)}"
            )
        x = F.pad(images, (pw, pw, ph, ph))
        height, width = x.shape[-2:]
        if height < k or width < k:
            raise ValueError(f"padded input {height}x{width} is smaller than the {k}x{k} kernel")
        rel = rel_indices(height, width, device=x.device, dtype=x.dtype)
        attn = self.pos_proj(rel).softmax(dim=1)  # (L queries, L keys, N_h): softmax over keys
        values = rearrange(self.v(rearrange(x, "b c h w -> b (h w) c")), "b l (n d) -> b n l d", n=self.num_heads)
        heads = torch.einsum("qkn,bnkd->bqnd", attn, values)
        y = rearrange(self.proj(heads.flatten(2)), "b (h w) c -> b c h w", h=height)
        return y[:, :, a : a + height - k + 1, a : a + width - k + 1]

# %% [markdown]
# A random 3×3 convolution from 3 to 8 channels, with padding 1, on a non-square 10×13 input, and a PSA with
# 9 heads at α = 20: the outputs agree to 1e-4. The centres are those of `head_centres(9)`.

# %%
torch.manual_seed(0)
x = torch.randn(2, 3, 10, 13)
conv3 = nn.Conv2d(3, 8, kernel_size=3, padding=1)
psa3 = ConvAsPSA(conv3, locality_strength=20.0)
assert torch.equal(psa3.centres, head_centres(9))
with torch.no_grad():
    y_conv, y_psa = conv3(x), psa3(x)
torch.testing.assert_close(y_psa, y_conv, atol=1e-4, rtol=0)
print(tuple(y_conv.shape), "max |PSA - conv| < 1e-4")

# %% [markdown]
# A 2×2 convolution with 4 heads (no padding), whose centres are the ConViT's (±½, ±½) moved by +½:

# %%
conv2 = nn.Conv2d(3, 8, kernel_size=2)
psa2 = ConvAsPSA(conv2, locality_strength=20.0)
torch.testing.assert_close(psa2.centres, head_centres(4) + 0.5)
print(psa2.centres.tolist())
with torch.no_grad():
    y_conv, y_psa = conv2(x), psa2(x)
torch.testing.assert_close(y_psa, y_conv, atol=1e-4, rtol=0)
print(tuple(y_conv.shape), "max |PSA - conv| < 1e-4")

# %% [markdown]
# And why the shift is needed: with the ConViT's own centre (½, ½), even at α = 20 a head splits its
# attention equally over four pixels.

# %%
pos_proj = nn.Linear(3, 4)
local_init(pos_proj, nn.Linear(3, 3), 20.0)
attn = positional_attention(pos_proj, 7, 7)[3, 3 * 7 + 3].detach()  # head 4, Δ = (½, ½), middle query
print(attn.reshape(7, 7)[2:6, 2:6])
top = attn.topk(5).values
torch.testing.assert_close(top[:4], torch.full((4,), 0.25))
assert top[4] < 1e-8

# %% [markdown]
# How exact is "exact"? At finite α each head leaks e^{−α} of weight to each of its four nearest neighbours,
# so the error falls exponentially with α, until float32 rounding (~1e-7) takes over:

# %%
alphas = [0.5, 1, 2, 4, 6, 8, 10, 12, 15, 20, 25]
errors = {}
for name, conv in (("3x3, 9 heads", conv3), ("2x2, 4 heads", conv2)):
    with torch.no_grad():
        errors[name] = [(ConvAsPSA(conv, a)(x) - conv(x)).abs().max().item() for a in alphas]
    falls = errors[name][: alphas.index(15)]
    assert all(e1 > e2 for e1, e2 in zip(falls, falls[1:])), errors[name]  # strictly falling up to α = 15
    assert all(e < 1e-5 for a, e in zip(alphas, errors[name]) if a >= 15), errors[name]  # float32 rounding
# printed to one digit while e^(−α) dominates; from α = 15 on, only the bound the assert checks (the rest is
# rounding noise, which differs from CPU to CPU)
for name, errs in errors.items():
    print(f"{name}: " + " ".join(f"{e:.0e}" if a < 15 else "<1e-5" for a, e in zip(alphas, errs)))

# %%
fig, ax = plt.subplots(figsize=(5, 3.2), dpi=80)
for name, errs in errors.items():
    ax.semilogy(alphas, errs, "o-", label=name)
ax.semilogy(alphas, [torch.tensor(-a).exp().item() for a in alphas], "k--", lw=1, label="e^(−α)")
ax.set_xlabel("locality strength α")
ax.set_ylabel("max |PSA − conv|")
ax.legend()
fig.tight_layout()
plt.show()

# %% [markdown]
# ## What a ConViT layer computes at initialization
#
# A GPSA layer of the ConViT is initialised with Eq. 5 *and* W_val = I (`local_init`), but its heads share the
# D channels: head h reads and writes only its own D_h = D/N_h of them. With W_qry = W_key = 0 (content
# ignored) and a sharp α, head h's attention is one-hot on the pixel at offset Δ_h, so the heads' outputs put
# together are the input with channel group h **shifted** by Δ_h — a convolution whose kernel holds one 1 per
# channel, at its group's tap. The output projection W_out, a 1 × 1 convolution, comes after. So the layer is
# `proj ∘ shift`: each input channel reaches the output through **one** tap of the k × k window, where a
# general k × k convolution (what `ConvAsPSA` computes, with heads as wide as the input) sees every channel
# through all k² taps. Checked on 9 heads of 2 channels each (D = 18), away from the border (where the softmax
# renormalises over the keys that exist instead of reading zero padding):

# %%
heads, width, side = 9, 2, 7
pos_proj, v = nn.Linear(3, heads), nn.Linear(heads * width, heads * width)
local_init(pos_proj, v, 30.0)  # sharp: every head one-hot on its tap
image_in = torch.randn(heads * width, side, side)
attn = positional_attention(pos_proj, side, side).detach()  # (heads, L, L)
values = rearrange(v(rearrange(image_in, "c h w -> (h w) c")), "l (n d) -> n l d", n=heads).detach()
gpsa_out = rearrange(attn @ values, "n (h w) d -> (n d) h w", h=side)  # each head's channels, put together

shift = torch.zeros(heads * width, heads * width, 3, 3)  # the convolution it equals: one tap per channel
for h, (dx, dy) in enumerate(head_centres(heads).long().tolist()):
    for c in range(h * width, (h + 1) * width):
        shift[c, c, dy + 1, dx + 1] = 1.0
conv_out = F.conv2d(image_in[None], shift, padding=1)[0]
torch.testing.assert_close(gpsa_out[:, 1:-1, 1:-1], conv_out[:, 1:-1, 1:-1], atol=1e-5, rtol=0)
reached = {"ConViT layer at init (proj ∘ shift)": int((shift != 0).any(dim=0).sum()),
           "general 3x3 convolution (ConvAsPSA)": heads * width * 9}
print("(input channel, tap) pairs that reach the output:", reached)
assert reached["general 3x3 convolution (ConvAsPSA)"] == 9 * reached["ConViT layer at init (proj ∘ shift)"]

# %% [markdown]
# With the ConViT-Ti's 4 heads, the centres are (±½, ±½): each head averages the four pixels around its centre
# (shown above), so the layer starts as a 2 × 2 box blur of each channel group, shifted by half a pixel in its
# own direction, followed by the 1 × 1 projection. Training then widens what each head reads: content
# attention (through the gate, next chapter) and W_val, W_out move away from their initial values.

# %% [markdown]
# ## Bad input
#
# A non-positive locality strength would make a head attend *away* from its centre (α < 0) or uniformly
# (α = 0); every entry point refuses it before touching a weight:

# %%
from convit_edu.checks import expect_error

for bad in (0.0, -1.0, float("nan")):
    print(expect_error(lambda: local_init(nn.Linear(3, 4), nn.Linear(8, 8), bad)))
    print(expect_error(lambda: ConvAsPSA(conv3, bad)))

# %% [markdown]
# ## What we have
#
# `convit_edu.conv_init` exports `head_centres` (Δ_h), `v_pos` (Eq. 5 in the `rel_indices` channel order),
# `local_init` (used by every GPSA layer in the next chapter) and `ConvAsPSA` (the convolution written as
# attention). Chapter 04 keeps this positional attention but adds the content attention back in, in a
# separate softmax, with a learnable gate per head.

# %% [markdown]
# ## Exercises
#
# **1. A Sobel filter as attention.** The horizontal Sobel kernel [[−1, 0, 1], [−2, 0, 2], [−1, 0, 1]] finds
# vertical edges. Build `sobel_psa`, a `ConvAsPSA` that computes it (one input channel, one output channel,
# padding 1, no bias) to within 10⁻³ on a grey 32 × 32 version of the photograph; the solution draws what it
# sees.

# %% tags=["solution"] jupyter={"source_hidden": true}
sobel = nn.Conv2d(1, 1, kernel_size=3, padding=1, bias=False)
with torch.no_grad():
    sobel.weight.copy_(torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]]))
sobel_psa = ConvAsPSA(sobel, locality_strength=20.0)  # α large: each head one-hot on its tap

grey = pil_to_tensor(photo.convert("L").resize((32, 32), Image.BICUBIC))[None].float() / 255
with torch.no_grad():
    edges = sobel_psa(grey)[0, 0]
fig, axes = plt.subplots(1, 2, figsize=(5, 2.5), dpi=80)
axes[0].imshow(grey[0, 0], cmap="gray"), axes[0].set_title("input", fontsize=9)
axes[1].imshow(edges, cmap="RdBu"), axes[1].set_title("Sobel-x by 9 attention heads", fontsize=9)
for ax in axes:
    ax.set_xticks([]), ax.set_yticks([])
plt.show()

# %%
# your answer: sobel_psa = ConvAsPSA(...)

# %%
from convit_edu.checks import WrongAnswer, check_answer


def check_sobel_psa(layer: nn.Module) -> None:
    check_answer(isinstance(layer, ConvAsPSA), "build it with ConvAsPSA(conv, locality_strength)")
    image = pil_to_tensor(photo.convert("L").resize((32, 32), Image.BICUBIC))[None].float() / 255
    kernel = torch.tensor([[[[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]]]])
    with torch.no_grad():
        out = layer(image)
    want = F.conv2d(image, kernel, padding=1)
    check_answer(out.shape == want.shape, f"output {tuple(out.shape)}, expected {tuple(want.shape)}: one input "
                 "and one output channel, padding 1")
    error = float((out - want).abs().max())
    check_answer(error < 1e-3, f"off by up to {error:.2g}: check the kernel's orientation (rows are y, columns x), "
                 "the bias, and that α is large enough for each head to be one-hot on its tap")


check_sobel_psa(sobel_psa)
print(expect_error(lambda: check_sobel_psa(ConvAsPSA(sobel, locality_strength=1.0)), WrongAnswer))

# %% [markdown]
# **2. α and the size of a head's footprint.** For the 9 heads of a 3 × 3 kernel (`local_init`, query in the
# middle of a 7 × 7 grid, no content), find the smallest α, to one decimal, at which *every* head puts at least
# 90 % of its attention on its own centre patch. Predict it first from the softmax (the nearest other patches
# are 1 away, the next ones √2), then compute it; set `alpha_90` to your value.

# %% tags=["solution"] jupyter={"source_hidden": true}
def centre_share(alpha: float) -> float:
    """The smallest share of attention any of the 9 heads puts on its own centre patch."""
    pos_proj = nn.Linear(3, 9)
    local_init(pos_proj, nn.Linear(3, 3), alpha)
    attn = positional_attention(pos_proj, 7, 7)[:, 3 * 7 + 3].detach()  # (heads, keys)
    targets = [(3 + int(dy)) * 7 + 3 + int(dx) for dx, dy in head_centres(9).tolist()]
    return float(attn[torch.arange(9), targets].min())


alpha_90 = next(a / 10 for a in range(1, 200) if centre_share(a / 10) >= 0.9)
# prediction: the 4 nearest patches alone give 4·e^(−α) = 1/9, α = ln 36 ≈ 3.6; the 4 diagonal ones add a little

# %%
# your answer: alpha_90 = ...

# %%
def check_alpha_90(answer: float) -> None:
    def share(alpha: float) -> float:
        pos_proj = nn.Linear(3, 9)
        local_init(pos_proj, nn.Linear(3, 3), alpha)
        attn = positional_attention(pos_proj, 7, 7)[:, 3 * 7 + 3].detach()
        return float(attn.max(dim=-1).values.min())  # each head's peak is its centre (checked earlier)

    check_answer(share(answer) >= 0.9, f"at α = {answer} some head keeps less than 90 % on its centre: larger")
    check_answer(share(answer - 0.1) < 0.9, f"α = {answer - 0.1:.1f} already reaches 90 %: look for the smallest")


check_alpha_90(alpha_90)
print(f"alpha_90 = {alpha_90}")
print(expect_error(lambda: check_alpha_90(2.0), WrongAnswer))
