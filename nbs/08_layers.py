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
# # The layers of a vision transformer: patches, MLP, stochastic depth, the block
#
# Chapters 01-07 built the attention layers: DeiT's `MHSA` and the ConViT's `GPSA`. This chapter builds the
# other layers a vision transformer is made of: first the way in, from an image to its tokens — the patch
# embedding, shown on one of the course's photographs, and a positional embedding resized to another image size —
# then the block that holds any of those attentions: the MLP, stochastic depth and the pre-norm block.
# Chapter 09 assembles them into the ConViT of Fig. 4 and its DeiT baseline.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp layers
# The layers of the ConViT and DeiT: patch embedding, MLP, stochastic depth, the pre-norm block, and the
# positional embedding resized to another grid.

# %%
import matplotlib.pyplot as plt
import torch
from einops import rearrange

from convit_edu.checks import expect_error

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## Patch embedding
#
# The ViT cuts a 224×224 image into 14×14 patches of 16×16 pixels and maps each flattened patch (3·16·16 = 768
# numbers) to a D_emb-dimensional token with one shared linear map: a `Conv2d` whose kernel and stride equal the
# patch size. `rearrange` turns its (B, D, H/p, W/p) output into the row-major tokens (B, L, D) that
# `rel_indices` assumes (token t = row·W + col). The module is `patch_embed.proj`, as in the official checkpoints.

# %%
#| export
import torch
from einops import rearrange
from torch import Tensor, nn


class PatchEmbed(nn.Module):
    """Cut images into patch_size×patch_size patches and embed each linearly (the ViT stem).

    ``forward(x)`` takes (B, in_chans, H, W) with H and W multiples of ``patch_size`` and returns the tokens
    (B, L, embed_dim), row-major over the patch grid, and the grid size (H / patch_size, W / patch_size).
    """

    def __init__(self, patch_size: int, in_chans: int, embed_dim: int) -> None:
        super().__init__()
        self.patch_size, self.in_chans = patch_size, in_chans
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size)

    def forward(self, x: Tensor) -> tuple[Tensor, tuple[int, int]]:
        if x.ndim != 4:
            raise ValueError(f"expected images of shape (batch, channels, height, width), got {tuple(x.shape)}")
        if x.dtype != self.proj.weight.dtype and not torch.is_autocast_enabled(x.device.type):
            hint = "x.float() / 255, then normalise" if not x.is_floating_point() else f"x.to({self.proj.weight.dtype})"
            raise TypeError(f"expected {self.proj.weight.dtype} images like the model's weights, got {x.dtype}: "
                            f"pass {hint} (or run under torch.autocast)")
        if x.shape[1] != self.in_chans:
            raise ValueError(
                f"expected images with in_chans={self.in_chans} channels, got {x.shape[1]} (shape {tuple(x.shape)})"
            )
        height, width = x.shape[-2:]
        if height % self.patch_size or width % self.patch_size:
            raise ValueError(
                f"image size {height}x{width} is not divisible by patch_size {self.patch_size}: "
                f"resize or crop to a multiple of {self.patch_size}"
            )
        x = self.proj(x)
        grid = (x.shape[-2], x.shape[-1])
        return rearrange(x, "b d h w -> b (h w) d"), grid


# %% [markdown]
# Check: the convolution equals "flatten every patch, multiply by the same matrix", on a 2-channel 8×12 image
# cut into 4×4 patches (a 2×3 grid).

# %%
embed = PatchEmbed(patch_size=4, in_chans=2, embed_dim=5)
img = torch.randn(1, 2, 8, 12)
tokens, grid = embed(img)
patches = rearrange(img, "b c (h p) (w q) -> b (h w) (c p q)", p=4, q=4)  # row-major patches, flattened
by_hand = patches @ embed.proj.weight.flatten(1).T + embed.proj.bias
print("tokens", tuple(tokens.shape), "grid", grid, "| one patch flattened:", tuple(patches.shape))
torch.testing.assert_close(tokens, by_hand)

# %% [markdown]
# ### A photograph cut into patches and tokens
#
# The same on one of the course's photographs, the way chapter 11's models see it: a 64 × 64 image from Tiny
# ImageNet, cut into 8-px patches (an 8 × 8 grid), each patch embedded as a token of width 96. The photographs come
# through the package's own data path, `convit_edu.datasets.tiny_imagenet` (chapter 14 builds it; `convit-edu data
# tiny-imagenet` fetches them once, before chapter 01), read by torchvision's `ImageFolder` as in chapter 11.

# %%
# NBVAL_IGNORE_OUTPUT
# (says whether the photographs were found or extracted now)
from convit_edu.datasets import tiny_imagenet

data_root = tiny_imagenet("../data")

# %% [markdown]
# The patch grid on the photograph (patch t at row t // 8, column t % 8), the patches in token order (row by row, the
# order `rel_indices` assumes), and the tokens the first block reads: 64 rows of 96 numbers, one row per patch. The
# cell checks that row t of the tokens is the embedding of patch t alone.

# %%
from torchvision import datasets, transforms

photos = datasets.ImageFolder(data_root / "train", transforms.ToTensor())
photo, label = photos[0]  # the first photograph of the first class, (3, 64, 64) in [0, 1]
names = dict(line.split("\t") for line in (data_root / "classes.txt").read_text().splitlines())
torch.manual_seed(0)
stem = PatchEmbed(patch_size=8, in_chans=3, embed_dim=96)  # chapter 11's models: 8-px patches, width 96
with torch.no_grad():
    tokens, grid = stem(photo[None])
    patches = rearrange(photo, "c (h p) (w q) -> (h w) c p q", p=8, q=8)  # (64, 3, 8, 8), row by row
    torch.testing.assert_close(tokens[0], stem.proj(patches).flatten(1))  # token t = the embedding of patch t
assert photo.shape == (3, 64, 64) and grid == (8, 8) and tokens.shape == (1, 64, 96)
print(f"a {tuple(photo.shape[1:])} photograph of a {names[photos.classes[label]].split(',')[0]} -> a {grid} grid of "
      f"8-px patches -> {tokens.shape[1]} tokens of width {tokens.shape[2]}; token t is the embedding of patch t")

fig = plt.figure(figsize=(11, 3.2), dpi=80)
left, middle, right = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1, 2.2, 1.1]})
left.imshow(photo.permute(1, 2, 0))
for line in range(1, 8):
    left.axhline(8 * line - 0.5, color="white", lw=0.8), left.axvline(8 * line - 0.5, color="white", lw=0.8)
for t in (0, 1, 7, 8, 63):
    left.text(8 * (t % 8) + 3.5, 8 * (t // 8) + 3.5, str(t), color="yellow", ha="center", va="center", fontsize=8)
left.set_title("the photograph, an 8 × 8 grid of patches", fontsize=9)
strip = torch.ones(3, 4 * 9 - 1, 16 * 9 - 1)  # the 64 patches in token order, 16 a row, 1-px gaps
for t, patch in enumerate(patches):
    strip[:, 9 * (t // 16) : 9 * (t // 16) + 8, 9 * (t % 16) : 9 * (t % 16) + 8] = patch
middle.imshow(strip.permute(1, 2, 0))
middle.set_yticks([9 * r + 3.5 for r in range(4)], [f"tokens {16 * r}–{16 * r + 15}" for r in range(4)], fontsize=7)
middle.set_title("the patches in token order: row by row", fontsize=9)
right.imshow(tokens[0], aspect="auto", cmap="RdBu")
right.set(xlabel="channel (96)", ylabel="token (64)")
right.set_title("the tokens (an untrained embedding)", fontsize=9)
for ax in (left, middle):
    ax.set_xticks([])
left.set_yticks([])
fig.tight_layout()
plt.show()

# %% [markdown]
# ## Positional embeddings at another resolution
#
# `pos_embed` holds one learned vector per patch of the grid the model was built for. On an image of another
# size the grid changes (224 → 14×14, 160 → 10×10, 224×160 → 14×10), so we view the vectors as a
# D_emb-channel image of the old grid and resample it bicubically to the new one, as DeiT does to fine-tune at
# 384 px. Slots that do not belong to a patch (DeiT's class and distillation tokens) are carried over as they
# are. GPSA layers need nothing of the kind: their positional attention is computed for the new H×W grid.

# %%
#| export
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor


def resize_pos_embed(
    pos_embed: Tensor, old_grid: tuple[int, int], new_grid: tuple[int, int], num_prefix_tokens: int = 0
) -> Tensor:
    """Bicubically resample the patch slots of ``pos_embed`` (1, P + H·W, D) from grid ``old_grid`` = (H, W) to
    ``new_grid``; the first ``num_prefix_tokens`` slots P (class/distillation tokens) are kept as they are."""
    old_grid, new_grid = tuple(old_grid), tuple(new_grid)
    if pos_embed.ndim != 3 or pos_embed.shape[1] != num_prefix_tokens + old_grid[0] * old_grid[1]:
        raise ValueError(
            f"pos_embed of shape {tuple(pos_embed.shape)} does not hold {num_prefix_tokens} prefix slots + a "
            f"{old_grid[0]}x{old_grid[1]} grid"
        )
    if old_grid == new_grid:
        return pos_embed
    prefix, patches = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    image = rearrange(patches, "b (h w) d -> b d h w", h=old_grid[0], w=old_grid[1])
    image = F.interpolate(image.float(), size=new_grid, mode="bicubic", align_corners=False).to(pos_embed.dtype)
    return torch.cat([prefix, rearrange(image, "b d h w -> b (h w) d")], dim=1)


# %% [markdown]
# A smooth embedding stays smooth: an embedding whose first channel is the row index and whose second is the
# column index is resampled to one that still grows down the rows and is constant along each row (bicubic
# interpolation overshoots a little at the borders, it is not exact), and the class-token slot is untouched.

# %%
rows, cols = torch.meshgrid(torch.arange(4.0), torch.arange(6.0), indexing="ij")
plane = torch.stack([rows.flatten(), cols.flatten()], dim=-1)  # (24, 2): channel 0 = row, channel 1 = column
pos = torch.cat([torch.full((1, 2), -7.0), plane])[None]        # one class slot + a 4x6 grid
resized = resize_pos_embed(pos, (4, 6), (8, 12), num_prefix_tokens=1)
print("shape", tuple(pos.shape), "->", tuple(resized.shape))
torch.testing.assert_close(resized[0, 0], torch.tensor([-7.0, -7.0]))
new_rows = resized[0, 1:, 0].reshape(8, 12)
print("rows of the 4x6 grid seen on 8x12, first column:", new_rows[:, 0])
assert torch.all(new_rows.diff(dim=0) >= 0) and torch.allclose(new_rows, new_rows[:, :1].expand(8, 12))

# %% [markdown]
# ## The MLP and stochastic depth
#
# Each block ends with a two-layer feed-forward network, width 4·D_emb with a GELU in between (`mlp.fc1`,
# `mlp.fc2`). DeiT trains with **stochastic depth** (drop path): in training, each sample skips the residual
# branch of a block with probability p, and the kept branches are scaled by 1/(1−p) so that the expected output
# is unchanged; at test time the branch is always used. p rises linearly with depth, from 0 in the first block
# to `drop_path_rate` (0.1 in the DeiT recipe) in the last.

# %%
#| export
import torch
from torch import Tensor, nn


class Mlp(nn.Module):
    """The feed-forward half of a block: Linear(D → hidden), GELU, dropout, Linear(hidden → D), dropout."""

    def __init__(self, embed_dim: int, hidden_dim: int, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(embed_dim, hidden_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, embed_dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class DropPath(nn.Module):
    """Stochastic depth: in training, zero the whole residual branch of a sample with probability ``p`` and
    scale the kept ones by 1/(1−p); the identity in eval mode."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"drop path probability must be in [0, 1), got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(1.0 - self.p)
        return x * keep / (1.0 - self.p)

    def extra_repr(self) -> str:
        return f"p={self.p:.3f}"


# %% [markdown]
# Checks: in eval mode the identity; in training every sample is either dropped whole or scaled by 1/(1−p).

# %%
dp = DropPath(0.25)
x = torch.ones(4000, 3, 2)
torch.testing.assert_close(dp.eval()(x), x)
y = dp.train()(x)
per_sample = y.flatten(1)
assert torch.equal(per_sample, per_sample[:, :1].expand_as(per_sample))  # a sample is dropped or kept whole
assert set(per_sample[:, 0].unique().tolist()) == {0.0, torch.tensor(1 / 0.75).item()}
kept = (per_sample[:, 0] > 0).float().mean().item()
print(f"kept {kept:.3f} of the samples (expected 0.75), mean output {y.mean().item():.3f} (expected 1)")
assert abs(kept - 0.75) < 0.03 and abs(y.mean().item() - 1) < 0.04

# %% [markdown]
# ## The block
#
# Pre-norm, as in ViT and DeiT: x ← x + DropPath(Attn(LN(x))), then x ← x + DropPath(MLP(LN(x))), LayerNorm
# with ε = 10⁻⁶. The attention is `MHSA` (chapter 01) or one of the positional attentions of chapters 05-07:
# the fast `GPSA`, the `GPSAReference` that materializes the attention matrix (same weights, same keys), or
# the ungated `PSA` of Eq. 4 for the App. A ablation. Positional layers need the patch grid (H, W) of their
# input; the block hands them the grid the model is built for (`grid_size`, so that those whose forward reads
# `rel_indices` build it at construction, chapter 05) and passes the grid of each input through.

# %%
#| export
import torch
from torch import Tensor, nn

from convit_edu.attention import MHSA
from convit_edu.checks import one_of
from convit_edu.gpsa import GPSA, PSA
from convit_edu.gpsa_reference import GPSAReference


class Block(nn.Module):
    """Pre-norm transformer block: ``x + DropPath(attn(LN(x)))`` then ``x + DropPath(mlp(LN(x)))``.

    ``attention`` is "mhsa" (Eq. 1-3), "gpsa" (Eq. 6-7, fast), "gpsa_reference" (Eq. 6-7, materialized) or
    "psa" (Eq. 4). ``forward(x, grid_size, return_attention)`` returns the new tokens, and with
    ``return_attention`` also the attention weights (B, num_heads, L, L). The constructor's ``grid_size`` is the
    patch grid the positional layers that read ``rel_indices`` build them for at once (None: when first needed).
    """

    def __init__(
        self, embed_dim: int, num_heads: int, attention: str = "mhsa", mlp_ratio: float = 4.0, qkv_bias: bool = False,
        drop: float = 0.0, attn_drop: float = 0.0, drop_path: float = 0.0, locality_strength: float = 1.0,
        use_local_init: bool = True, grid_size: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dim, eps=1e-6)
        if attention == "mhsa":
            self.attn = MHSA(embed_dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=drop)
        else:
            layers = {"gpsa": GPSA, "gpsa_reference": GPSAReference, "psa": PSA}
            self.attn = layers[one_of("attention", attention, ["mhsa", *layers])](
                embed_dim, num_heads, qkv_bias=qkv_bias, attn_drop=attn_drop, proj_drop=drop,
                locality_strength=locality_strength, use_local_init=use_local_init, grid_size=grid_size,
            )
        self.is_positional = attention != "mhsa"
        self.drop_path = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(embed_dim, eps=1e-6)
        self.mlp = Mlp(embed_dim, int(embed_dim * mlp_ratio), drop=drop)

    def forward(
        self, x: Tensor, grid_size: tuple[int, int] | None = None, return_attention: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        h = self.norm1(x)
        if self.is_positional:
            out = self.attn(h, grid_size=grid_size, return_attention=return_attention)
        else:
            out = self.attn(h, return_attention=return_attention)
        y, attn = out if return_attention else (out, None)
        x = x + self.drop_path(y)
        x = x + self.drop_path(self.mlp(self.norm2(x)))
        return (x, attn) if return_attention else x


# %% [markdown]
# A GPSA block on a 3×4 grid of 12 tokens, and an MHSA block on 1 + 12 tokens; both keep the shape. And the
# block is pre-norm with two residual connections: with the last linear map of the attention and of the MLP
# set to zero, it passes its input through unchanged (a post-norm block would still normalise it).

# %%
torch.manual_seed(0)
gpsa_block, mhsa_block = Block(48, 4, attention="gpsa"), Block(48, 4, attention="mhsa", qkv_bias=True)
x = torch.randn(2, 12, 48)
y, attn = gpsa_block(x, grid_size=(3, 4), return_attention=True)
print("GPSA block", tuple(x.shape), "->", tuple(y.shape), "attention", tuple(attn.shape))
y2, attn2 = mhsa_block(torch.randn(2, 13, 48), return_attention=True)
print("MHSA block", (2, 13, 48), "->", tuple(y2.shape), "attention", tuple(attn2.shape))
torch.testing.assert_close(gpsa_block(x, grid_size=(3, 4)), y)  # the fast path gives the same tokens
silent = Block(48, 4, attention="gpsa")
with torch.no_grad():
    for linear in (silent.attn.proj, silent.mlp.fc2):
        linear.weight.zero_(), linear.bias.zero_()
torch.testing.assert_close(silent(x, grid_size=(3, 4)), x)

# %% [markdown]
# The block as a picture: its boxes are the module's own children, in the order its forward calls them, recorded
# with forward hooks on one call (the residual arrows are the two additions the cell above checks):

# %%
from matplotlib.patches import FancyBboxPatch


def draw_block(block: Block, path: list[str]) -> None:
    """A pre-norm block: x → norm1 → attn → + x → norm2 → mlp → + (the residual paths drawn above)."""
    children = dict(block.named_children())
    path = [path[0], path[1], "+", path[2], path[3], "+"]
    labels = {"norm1": "LayerNorm", "norm2": "LayerNorm", "+": "+", "mlp": "MLP\n(fc1, GELU, fc2)",
              "attn": type(children["attn"]).__name__}
    fig, ax = plt.subplots(figsize=(9, 1.9), dpi=80)
    for i, name in enumerate(["x", *path]):
        ax.add_patch(FancyBboxPatch((i * 1.3, 0), 1.0, 0.8, boxstyle="round,pad=0.05",
                                    color="#dddddd" if name in ("x", "+") else "#f4a261"))
        ax.text(i * 1.3 + 0.5, 0.4, "x" if name == "x" else labels[name], ha="center", va="center", fontsize=8)
        if i:
            ax.annotate("", (i * 1.3 - 0.05, 0.4), (i * 1.3 - 0.25, 0.4), arrowprops=dict(arrowstyle="->"))
    for start, end in ((0, 3), (3, 6)):  # the residual connections skip over the norm and the sub-layer
        ax.annotate("", (end * 1.3 + 0.5, 0.85), (start * 1.3 + 0.5, 0.85),
                    arrowprops=dict(arrowstyle="->", connectionstyle="arc3,rad=-0.3", color="crimson"))
    ax.set(xlim=(-0.2, 7 * 1.3), ylim=(-0.2, 2.0))
    ax.axis("off")


called = []
hooks = [module.register_forward_hook(lambda module, args, out, name=name: called.append(name))
         for name, module in gpsa_block.named_children() if name != "drop_path"]
with torch.no_grad():
    gpsa_block(x, grid_size=(3, 4))
for hook in hooks:
    hook.remove()
assert called == ["norm1", "attn", "norm2", "mlp"] and type(gpsa_block.attn).__name__ == "GPSA", called
print("the forward calls", " → ".join(called))
draw_block(gpsa_block, called)
plt.show()

# %% [markdown]
# ## Exercises
#
# How they work (chapter 00): replace the placeholder `...` in the answer cell, then run the check below it.
#
# **1. Patches of a wide image.** A 96 × 160 image (height × width) goes through a patch embedding with 16-px
# patches. Without running it, set `grid` to the (rows, columns) of its patch grid and `num_tokens` to the
# number of tokens the first block sees.

# %%
grid, num_tokens = ..., ...  # your answer: grid, num_tokens = (..., ...), ...

# %%
from convit_edu.checks import check_answer, demonstrate, grade, reveal


def check_patches(grid: tuple[int, int], num_tokens: int) -> None:
    tokens, want_grid = PatchEmbed(16, 3, 8)(torch.zeros(1, 3, 96, 160))
    check_answer(tuple(grid) == tuple(want_grid), "the grid is (rows, columns) of patches: the height is cut into "
                 "rows, the width into columns, each 16 px")
    check_answer(num_tokens == tokens.shape[1], "one token per patch of the grid (a model's class token joins later, "
                 "not in the patch embedding)")


grade("grid, num_tokens", (grid, num_tokens), lambda answer: check_patches(*answer))
demonstrate(lambda answer: check_patches(*answer), {"(columns, rows)": ((10, 6), 60),
                                                    "pixels, not patches": ((96, 160), 15360),
                                                    "the class token counted": ((6, 10), 61)})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(grid, num_tokens):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    grid, num_tokens = (96 // 16, 160 // 16), (96 // 16) * (160 // 16)  # (6, 10): 60 tokens, row-major
    grade("grid, num_tokens", (grid, num_tokens), lambda answer: check_patches(*answer))

# %% [markdown]
# **2. One DeiT-Ti block, parameter by parameter.** A block of DeiT-Ti: width D = 192, 3 heads, MLP ratio 4,
# `MHSA` with qkv bias. Count its parameters by hand — the two LayerNorms, the qkv and output projections, the
# MLP's two linear maps — and set `block_params`.

# %%
block_params = ...  # your answer: block_params = ...

# %%
def check_block_params(answer: int) -> None:
    check_answer(isinstance(answer, int) and not isinstance(answer, bool), f"a count is a whole number, got {answer!r}")
    want = sum(p.numel() for p in Block(192, 3, qkv_bias=True).parameters())
    check_answer(answer == want, f"{'too many' if answer > want else 'too few'}: every linear map has a bias "
                 "(the qkv one too, in DeiT), each LayerNorm has a weight and a bias of width D, and the MLP is 4·D wide")


grade("block_params", block_params, check_block_params)
demonstrate(check_block_params, {"the weight matrices alone, 12·D²": 12 * 192**2, "as a float": 12 * 192**2 * 1.0,
                                 "an MLP of width D": 6 * 192**2 + 10 * 192})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(block_params):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    D = 192
    block_params = (2 * 2 * D  # two LayerNorms, a weight and a bias each
                    + 3 * D * D + 3 * D + D * D + D  # qkv (with bias) and the output projection
                    + D * 4 * D + 4 * D + 4 * D * D + D)  # fc1 and fc2: 12 D² + 13 D in all
    print(f"block_params = {block_params:,}")
    grade("block_params", block_params, check_block_params)

# %% [markdown]
# **3. The block, yours.** Write `my_block(block, x, grid)`: the output of the pre-norm block `block` (in eval mode,
# so stochastic depth is off) on tokens `x`, from its parts — `block.norm1`, `block.attn`, `block.norm2`,
# `block.mlp` — with the two residual branches of the picture at the top. A GPSA block's attention takes the
# patch grid, `block.attn(h, grid_size=grid)`; an MHSA block's takes the tokens alone (`block.is_positional` says
# which). (Chapter 09's models are built of the package's `Block`.)

# %%
my_block = ...  # your answer: def my_block(block, x, grid): ...

# %%
def attend(block: Block, h: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """The block's attention on normalised tokens `h`: GPSA with the grid, MHSA without."""
    return block.attn(h, grid_size=grid) if block.is_positional else block.attn(h)


def check_my_block(fn) -> None:
    torch.manual_seed(0)
    for attention, tokens in (("gpsa", 16), ("mhsa", 17)):  # a GPSA block on a 4 x 4 grid; MHSA with a class token
        block = Block(48, 4, attention=attention, drop_path=0.5).eval()
        x = torch.randn(2, tokens, 48)
        with torch.no_grad():
            got, want = fn(block, x, (4, 4)), block(x, (4, 4))
            branches = block.mlp(block.norm2(attend(block, block.norm1(x), (4, 4))))  # no residual connection
            parallel = x + attend(block, block.norm1(x), (4, 4)) + block.mlp(block.norm2(x))
        check_answer(not torch.allclose(got, branches, atol=1e-5), f"{attention.upper()} block: no residual connection: "
                     "each branch adds its output to the stream it read (x + ...)")
        check_answer(not torch.allclose(got, parallel, atol=1e-5), f"{attention.upper()} block: the MLP branch reads "
                     "the stream after the attention branch has been added to it, not x")
        error = (got - want).abs().max().item()
        check_answer(error < 1e-5, f"{attention.upper()} block: off by up to {error:.2f}: each branch normalises its "
                     "input first (pre-norm): x + attn(norm1(x)), then that + mlp(norm2(that))")


def post_norm(block: Block, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:  # a slip: the original Transformer's
    x = block.norm1(x + attend(block, x, grid))
    return block.norm2(x + block.mlp(x))


grade("my_block", my_block, check_my_block)
demonstrate(check_my_block, {
    "no residual connections": lambda b, x, g: b.mlp(b.norm2(attend(b, b.norm1(x), g))),
    "the two branches in parallel": lambda b, x, g: x + attend(b, b.norm1(x), g) + b.mlp(b.norm2(x)),
    "post-norm": post_norm,
})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(my_block):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def my_block(block: Block, x: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        h = block.norm1(x)
        x = x + (block.attn(h, grid_size=grid) if block.is_positional else block.attn(h))
        return x + block.mlp(block.norm2(x))

    grade("my_block", my_block, check_my_block)
