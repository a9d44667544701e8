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
# # From an image to tokens: patches and positions
#
# Chapters 01-07 built the attention layers: DeiT's `MHSA` and the ConViT's `GPSA`. They read tokens; this chapter
# builds the way in, from an image to its tokens: the patch embedding, shown on one of the course's photographs, and
# a positional embedding resized to another image size. The next chapter (`08_transformer_block`) builds the block
# that holds any of those attentions, and chapter 09 assembles both into the ConViT of Fig. 4 and its DeiT baseline.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp patches
# The way into a vision transformer: the patch embedding, and the positional embedding resized to another grid.

# %%
import matplotlib.pyplot as plt
import torch
from einops import rearrange

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
# through the package's own data path, `convit_edu.photographs.tiny_imagenet` (chapter 00_photographs builds it;
# `convit-edu data tiny-imagenet` runs it once, before chapter 01), read by torchvision's `ImageFolder` as in
# chapter 11.

# %%
# NBVAL_IGNORE_OUTPUT
# (says whether the photographs were found or extracted now)
from convit_edu.photographs import tiny_imagenet

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
# ## Exercises
#
# How they work (chapter 00_input_checks): replace the placeholder `...` in the answer cell and run the check under it.
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
# **2. Tokens back to a picture.** The figure above laid the patches out in token order. Write
# `patches_to_image(patches, grid, patch_size)`, the way back: from the flattened patches (L, C·p·p) of a (rows,
# columns) `grid` — token t at row t // columns, column t % columns, each patch flattened channel by channel and
# row by row, as `rearrange(image, "c (h p) (w q) -> (h w) (c p q)", p=p, q=p)` makes them — to the image (C, H, W).

# %%
patches_to_image = ...  # your answer: def patches_to_image(patches, grid, patch_size): ...

# %%
def check_patches_to_image(fn) -> None:
    image = torch.arange(3 * 8 * 12.0).reshape(3, 8, 12)  # 3 channels, a 2 x 3 grid of 4-px patches
    flat = rearrange(image, "c (h p) (w q) -> (h w) (c p q)", p=4, q=4)
    got = fn(flat, (2, 3), 4)
    check_answer(isinstance(got, torch.Tensor) and tuple(got.shape) == (3, 8, 12), "the image is (C, H, W) = "
                 f"(3, 8, 12) for a grid of 2 rows and 3 columns of 4-px patches, got {getattr(got, 'shape', got)!r}")
    columns_first = rearrange(flat, "(w h) (c p q) -> c (h p) (w q)", h=2, w=3, p=4, q=4)
    check_answer(not torch.equal(got, columns_first), "the tokens run along a row first: token t sits at row "
                 "t // columns, column t % columns")
    check_answer(torch.equal(got, image), "inside a token the numbers run channel by channel, and within a channel "
                 "row by row: (c p q), p the pixel's row in its patch")


grade("patches_to_image", patches_to_image, check_patches_to_image)
demonstrate(check_patches_to_image, {
    "rows and columns swapped": lambda x, g, p: rearrange(x, "(h w) (c p q) -> c (h p) (w q)", h=g[1], w=g[0], p=p, q=p),
    "the tokens column by column": lambda x, g, p: rearrange(x, "(w h) (c p q) -> c (h p) (w q)", h=g[0], w=g[1], p=p,
                                                             q=p),
    "a patch column by column": lambda x, g, p: rearrange(x, "(h w) (c q p) -> c (h p) (w q)", h=g[0], w=g[1], p=p,
                                                          q=p),
    "the channels last in a token": lambda x, g, p: rearrange(x, "(h w) (p q c) -> c (h p) (w q)", h=g[0], w=g[1], p=p,
                                                              q=p)})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(patches_to_image):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def patches_to_image(patches: torch.Tensor, grid: tuple[int, int], patch_size: int) -> torch.Tensor:
        return rearrange(patches, "(h w) (c p q) -> c (h p) (w q)", h=grid[0], w=grid[1], p=patch_size, q=patch_size)

    grade("patches_to_image", patches_to_image, check_patches_to_image)
