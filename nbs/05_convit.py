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
# # The ConViT and DeiT models: zoo, Table 1, checkpoints, other resolutions
#
# Chapters 01-04 built the attention layers: the plain multi-head self-attention (`MHSA`) of DeiT, and the
# gated positional self-attention (`GPSA`) with its convolutional initialization. This chapter assembles them
# into whole networks. We build the convolutional patch embedding, the pre-norm transformer block, and the
# model of Fig. 4 of the paper: a DeiT whose first `local_up_to_layer` = 10 of its 12 blocks use GPSA, with the
# class token concatenated only *after* the last GPSA block. Then we put the twelve models of Table 1 in a zoo,
# count their parameters and multiply-accumulates against the paper's Size and Flops columns, run them on
# other image sizes, load official (and timm) checkpoints, and add the switches the paper's ablations need.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp models
# The ConViT and DeiT models: zoo, Table 1, checkpoints, other resolutions.
#
# One module for the whole model family, as timm keeps one file per family: the config, the layers, the zoo, the
# analytic counts and the checkpoint loading are read together, and chapter 05 builds them in that order (the
# course reorganisation splits the chapter, and this module with it, by topic).

# %%
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F

from convit_edu.checks import expect_error

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## The architecture, in one picture
#
# ```
# image (B, 3, H, W)
#   └─ patch embedding: Conv2d(kernel = stride = 16)   → (B, L, D)      L = (H/16)·(W/16) patches
#   └─ + pos_embed (one learned slot per patch)
#   └─ blocks 1 … local_up_to_layer:   x + GPSA(LN(x)),  x + MLP(LN(x))     patches only
#   └─ concatenate the class token                       → (B, 1 + L, D)
#   └─ blocks local_up_to_layer+1 … depth:  x + MHSA(LN(x)), x + MLP(LN(x))
#   └─ LayerNorm, take the class token, Linear head      → (B, num_classes)
# ```
#
# The DeiT baseline is the same network with `MHSA` in every block (`local_up_to_layer = 0`, with qkv bias),
# and its class token joins at the input, with its own slot in `pos_embed`. The ConViT's class token gets no
# positional embedding: GPSA layers attend by *relative* position on the patch grid, and the class token has
# no place on that grid, so it only joins once the positional layers are done (Sec. 3, "Architectural
# details").
#
# ## The configuration
#
# Everything that defines a model is one frozen dataclass. Two widths are easily confused, and the official
# code confused them (its `embed_dim` argument was the width *per head*, multiplied by `num_heads` inside,
# which broke checkpoint loading for its users): here `embed_dim` is always the total token width D_emb and
# `head_dim = embed_dim // num_heads` the width per head. The ablation switches of the paper are fields too;
# each is described in the docstring and exercised below.

# %%
#| export
from dataclasses import dataclass, fields

from convit_edu.checks import one_of, positive_int
from convit_edu.conv_init import check_locality_strength

LOCAL_ATTENTIONS = ("gpsa", "gpsa_reference", "psa")


@dataclass(frozen=True)
class ModelConfig:
    """A ConViT or DeiT (Sec. 3, Table 1). ``embed_dim`` is the total width D_emb, ``head_dim`` the width per head.

    Architecture: ``img_size`` (int or (height, width)) and ``patch_size`` fix the patch grid that ``pos_embed``
    is built for (the model also runs on other sizes, interpolating it); ``depth`` blocks of ``num_heads``
    heads, MLP width ``mlp_ratio * embed_dim``; ``qkv_bias`` for the query/key/value projections (DeiT: True,
    ConViT: False). The first ``local_up_to_layer`` blocks use positional attention, initialized as a
    convolution with ``locality_strength`` α > 0 (Eq. 5); the class token joins after them.
    ``class_token_pos_embed`` (DeiT) makes the class token join at the input with its own ``pos_embed`` slot;
    it requires ``local_up_to_layer = 0``. ``distilled`` adds DeiT's distillation token and head.

    Regularization: ``drop_rate`` (dropout after the positional embedding, the attention projection and in the
    MLP), ``attn_drop_rate`` (on attention weights), ``drop_path_rate`` (stochastic depth, rising linearly from
    0 in the first block to this value in the last).

    Ablations (Table 3, App. A): ``local_attention`` = "gpsa" (fast, default), "gpsa_reference" (materializes
    the attention, same weights) or "psa" (Eq. 4, no gating); ``use_local_init=False`` removes the
    convolutional initialization; ``freeze_gating`` freezes every λ at 0 (σ(λ) = 1/2: content and position get
    equal weight); ``freeze_gpsa`` freezes the whole attention of the positional layers. ``local_up_to_layer``
    sets the number of GPSA layers (0 gives a DeiT-like model whose class token has no positional slot).
    """

    img_size: int | tuple[int, int] = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 192
    depth: int = 12
    num_heads: int = 4
    mlp_ratio: float = 4.0
    qkv_bias: bool = False
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    drop_path_rate: float = 0.0
    local_up_to_layer: int = 10
    locality_strength: float = 1.0
    class_token_pos_embed: bool = False
    distilled: bool = False
    local_attention: str = "gpsa"
    use_local_init: bool = True
    freeze_gating: bool = False
    freeze_gpsa: bool = False

    def __post_init__(self) -> None:
        size = self.img_size
        if isinstance(size, (tuple, list)):
            if len(size) != 2:
                raise ValueError(f"img_size must be an int or (height, width), got {size!r}")
            size = tuple(positive_int("img_size", s) for s in size)
        else:
            size = positive_int("img_size", size)
        object.__setattr__(self, "img_size", size)  # a list from a JSON config becomes a tuple
        for name in ("patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads"):
            positive_int(name, getattr(self, name))
        height, width = self.image_size
        for side, value in (("height", height), ("width", width)):
            if value % self.patch_size:
                raise ValueError(
                    f"img_size {value} (image {side}) is not divisible by patch_size {self.patch_size}"
                )
        if self.embed_dim % self.num_heads:
            raise ValueError(
                f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}: embed_dim is the "
                f"total width, num_heads * head_dim (e.g. embed_dim={self.num_heads * 48} for head_dim 48)"
            )
        if self.mlp_ratio <= 0:
            raise ValueError(f"mlp_ratio must be positive, got {self.mlp_ratio}")
        for name in ("drop_rate", "attn_drop_rate", "drop_path_rate"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not 0 <= self.local_up_to_layer < self.depth:
            raise ValueError(
                f"local_up_to_layer {self.local_up_to_layer} must be in [0, depth) = [0, {self.depth}): the class "
                f"token joins after the last GPSA block and needs at least one SA block to read the patches"
            )
        if self.class_token_pos_embed and self.local_up_to_layer:
            raise ValueError(
                f"class_token_pos_embed (a DeiT class token joining at the input) needs local_up_to_layer=0, "
                f"got local_up_to_layer={self.local_up_to_layer}"
            )
        one_of("local_attention", self.local_attention, LOCAL_ATTENTIONS)
        if self.use_local_init:  # α is used by the convolutional initialization only
            check_locality_strength(self.locality_strength)
        for name in ("freeze_gating", "freeze_gpsa"):
            if getattr(self, name) and not self.local_up_to_layer:
                raise ValueError(f"{name} needs GPSA layers, but local_up_to_layer=0")
        if self.freeze_gating and self.local_attention == "psa":
            raise ValueError("freeze_gating needs gated layers, but local_attention='psa' has no gating_param")

    @property
    def image_size(self) -> tuple[int, int]:
        """(height, width) in pixels."""
        return (self.img_size, self.img_size) if isinstance(self.img_size, int) else self.img_size

    @property
    def grid_size(self) -> tuple[int, int]:
        """(rows, columns) of the patch grid that ``pos_embed`` is built for."""
        height, width = self.image_size
        return height // self.patch_size, width // self.patch_size

    @property
    def num_patches(self) -> int:
        rows, cols = self.grid_size
        return rows * cols

    @property
    def head_dim(self) -> int:
        """Width of one head: embed_dim // num_heads (48 for ConViT-Ti/S/B, 64 for DeiT and the "+" models)."""
        return self.embed_dim // self.num_heads

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens in front of the patches once the class token has joined: class (+ distillation) token."""
        return 1 + int(self.distilled)


def config_fields() -> list[str]:
    """Names of the ``ModelConfig`` fields, the keys ``create_model`` accepts as overrides."""
    return [f.name for f in fields(ModelConfig)]


# %% [markdown]
# A config of a ConViT-Ti, and what it derives: 4 heads of width 48, a 14×14 grid of patches. Bad values are
# refused when the config is made, with the value that was wrong:

# %%
cfg = ModelConfig(embed_dim=192, num_heads=4)
print(f"embed_dim {cfg.embed_dim} = num_heads {cfg.num_heads} x head_dim {cfg.head_dim}; grid {cfg.grid_size}")
assert (cfg.head_dim, cfg.grid_size, cfg.num_patches) == (48, (14, 14), 196)

for bad in (dict(img_size=225), dict(embed_dim=200, num_heads=3), dict(local_up_to_layer=13)):
    print(f"{bad}:", expect_error(lambda: ModelConfig(**bad)))

# %% [markdown]
# ## Patch embedding
#
# The ViT cuts a 224×224 image into 14×14 non-overlapping patches of 16×16 pixels and maps each flattened
# patch (3·16·16 = 768 numbers) to a D_emb-dimensional token with one shared linear map. A `Conv2d` whose
# kernel and stride both equal the patch size is exactly that linear map, applied at every patch position;
# `rearrange` then turns the (B, D, H/p, W/p) feature map into the row-major token sequence (B, L, D) that
# `rel_indices` assumes (token t = row·W + col). The module is called `patch_embed.proj`, the name in the
# official checkpoints.

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
# Checks: in eval mode the identity; in training every sample is either dropped whole or scaled by 1/(1−p),
# and the mean over many samples stays close to the input.

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
# with ε = 10⁻⁶. The attention is `MHSA` (chapter 01) or one of the positional attentions of chapter 04:
# the fast `GPSA`, the `GPSAReference` that materializes the attention matrix (same weights, same keys), or
# the ungated `PSA` of Eq. 4 for the App. A ablation. Positional layers need the patch grid (H, W) to build
# `rel_indices`; the block hands them the grid the model is built for (`grid_size`, so that they build it at
# construction, chapter 04) and passes the grid of each input through.

# %%
#| export
import torch
from torch import Tensor, nn

from convit_edu.attention import MHSA
from convit_edu.checks import one_of
from convit_edu.gpsa import GPSA, PSA, GPSAReference


class Block(nn.Module):
    """Pre-norm transformer block: ``x + DropPath(attn(LN(x)))`` then ``x + DropPath(mlp(LN(x)))``.

    ``attention`` is "mhsa" (Eq. 1-3), "gpsa" (Eq. 6-7, fast), "gpsa_reference" (Eq. 6-7, materialized) or
    "psa" (Eq. 4). ``forward(x, grid_size, return_attention)`` returns the new tokens, and with
    ``return_attention`` also the attention weights (B, num_heads, L, L). The constructor's ``grid_size`` is the
    patch grid the positional layers build their ``rel_indices`` for at once (None: at their first forward).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        attention: str = "mhsa",
        mlp_ratio: float = 4.0,
        qkv_bias: bool = False,
        drop: float = 0.0,
        attn_drop: float = 0.0,
        drop_path: float = 0.0,
        locality_strength: float = 1.0,
        use_local_init: bool = True,
        grid_size: tuple[int, int] | None = None,
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
# A GPSA block on a 3×4 grid of 12 tokens, and an MHSA block on 1 + 12 tokens; both keep the shape, and the
# attention weights they return are row-stochastic:

# %%
torch.manual_seed(0)
gpsa_block, mhsa_block = Block(48, 4, attention="gpsa"), Block(48, 4, attention="mhsa", qkv_bias=True)
x = torch.randn(2, 12, 48)
y, attn = gpsa_block(x, grid_size=(3, 4), return_attention=True)
print("GPSA block", tuple(x.shape), "->", tuple(y.shape), "attention", tuple(attn.shape))
y2, attn2 = mhsa_block(torch.randn(2, 13, 48), return_attention=True)
print("MHSA block", (2, 13, 48), "->", tuple(y2.shape), "attention", tuple(attn2.shape))
torch.testing.assert_close(attn.sum(-1), torch.ones(2, 4, 12))
torch.testing.assert_close(attn2.sum(-1), torch.ones(2, 4, 13))
torch.testing.assert_close(gpsa_block(x, grid_size=(3, 4)), y)  # the fast path gives the same tokens

# %% [markdown]
# ## Positional embeddings at another resolution
#
# `pos_embed` holds one learned vector per patch of the grid the model was built for. On an image of another
# size the grid changes (224 → 14×14, 160 → 10×10, 224×160 → 14×10), so we view the vectors as a
# D_emb-channel image of the old grid and resample it bicubically to the new one, as DeiT does to fine-tune at
# 384 px. Slots that do not belong to a patch (DeiT's class and distillation tokens) are carried over as they
# are. GPSA layers need nothing of the kind: their `rel_indices` are rebuilt for the new H×W grid.

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
# ## The model
#
# `VisionTransformer` follows the picture at the top. A few details matter for loading the official weights
# and for the analysis chapter:
#
# * names follow the official checkpoints: `patch_embed.proj`, `pos_embed`, `cls_token` (and `dist_token`),
#   `blocks.i.{norm1, attn, norm2, mlp.fc1, mlp.fc2}`, `norm`, `head` (and `head_dist`);
# * initialization is DeiT's: normal with std 0.02 for every linear layer, `pos_embed` and the tokens (DeiT
#   truncates it at ±2, a hundred standard deviations away, which never happens), zero biases. The positional
#   layers initialize themselves (their `init_weights`, chapter 04: the same normal init, then Eq. 5), so the
#   model leaves them alone: Eq. 5 is applied once per layer, in one place. (The official ConViT applies it
#   in the layer, overwrites it with the global init, and applies it again.);
# * `gates()` returns σ(λ) of every head of every GPSA layer, (layers, heads), as the forward uses them;
# * `forward_features(x)` returns the normalized tokens; with `return_attention` / `return_block_inputs` it
#   returns a `ForwardRecord` with every block's attention weights and input, for chapter 09, from the same
#   forward pass;
# * with `distilled=True` there is a distillation token next to the class token and a second head
#   (`head_dist`): in training mode the model returns both logits (DeiT hard distillation), in eval mode their
#   mean;
# * `mask_pos_embed = True` drops the absolute positional embedding at test time (SM F, Table 5).

# %%
#| export
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from convit_edu.gpsa import GPSA, GPSAReference


@dataclass
class ForwardRecord:
    """What ``forward_features(..., return_attention / return_block_inputs)`` records, one entry per block.

    ``features``: the normalized output tokens (B, P + L, D). ``grid_size``: the patch grid (rows, cols) of
    this input. ``num_prefix_tokens[i]``: tokens in front of the patches in block i (0 in the GPSA blocks of a
    ConViT). ``attentions[i]``: attention weights (B, num_heads, T_i, T_i) of block i. ``block_inputs[i]``: the
    tokens (B, T_i, D) entering block i, before its first LayerNorm. The lists are None when not requested.
    """

    features: Tensor
    grid_size: tuple[int, int]
    num_prefix_tokens: list[int]
    attentions: list[Tensor] | None = None
    block_inputs: list[Tensor] | None = None


class VisionTransformer(nn.Module):
    """The ConViT (``local_up_to_layer`` > 0 GPSA blocks, class token joining after them, Fig. 4) and the DeiT
    (``local_up_to_layer = 0``, ``class_token_pos_embed``) of Table 1, built from a ``ModelConfig``.

    ``forward(x)`` takes images (B, in_chans, H, W), H and W multiples of ``patch_size`` (any size: ``pos_embed``
    is interpolated for a grid other than the config's) and returns logits (B, num_classes); with
    ``distilled`` it returns ``(class_logits, dist_logits)`` in training mode and their mean in eval mode.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = c = config
        self.patch_embed = PatchEmbed(c.patch_size, c.in_chans, c.embed_dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, c.embed_dim))
        if c.distilled:
            self.dist_token = nn.Parameter(torch.zeros(1, 1, c.embed_dim))
        prefix_slots = c.num_prefix_tokens if c.class_token_pos_embed else 0
        self.pos_embed = nn.Parameter(torch.zeros(1, prefix_slots + c.num_patches, c.embed_dim))
        self.pos_drop = nn.Dropout(c.drop_rate)
        drop_path_rates = [c.drop_path_rate * i / max(c.depth - 1, 1) for i in range(c.depth)]  # linear in depth
        self.blocks = nn.ModuleList(
            Block(
                c.embed_dim, c.num_heads,
                attention=c.local_attention if i < c.local_up_to_layer else "mhsa",
                mlp_ratio=c.mlp_ratio, qkv_bias=c.qkv_bias, drop=c.drop_rate, attn_drop=c.attn_drop_rate,
                drop_path=drop_path_rates[i], locality_strength=c.locality_strength,
                use_local_init=c.use_local_init, grid_size=c.grid_size,
            )
            for i in range(c.depth)
        )
        self.norm = nn.LayerNorm(c.embed_dim, eps=1e-6)
        self.head = nn.Linear(c.embed_dim, c.num_classes)
        if c.distilled:
            self.head_dist = nn.Linear(c.embed_dim, c.num_classes)
        self.mask_pos_embed = False
        self._init_weights()

    @property
    def local_layers(self) -> list[nn.Module]:
        """The positional attention modules (GPSA/PSA) of the first ``local_up_to_layer`` blocks."""
        return [block.attn for block in self.blocks[: self.config.local_up_to_layer]]

    @property
    def gated_layers(self) -> list[nn.Module]:
        """The GPSA layers: the ``local_layers`` that have a gate (none when they are PSA)."""
        return [layer for layer in self.local_layers if isinstance(layer, (GPSA, GPSAReference))]

    @torch.no_grad()
    def gates(self) -> Tensor:
        """σ(λ_h) (Eq. 7) of every head of every GPSA layer, as the forward mixes with them (``gate_override``
        included): (GPSA layers, num_heads), detached, on the model's device; (0, num_heads) without GPSA layers."""
        layers = self.gated_layers
        if not layers:
            return self.cls_token.new_zeros(0, self.config.num_heads)
        return torch.stack([layer.gate() for layer in layers])

    @torch.no_grad()
    def _init_weights(self) -> None:
        c = self.config
        # the positional layers initialized themselves (init_weights: this normal init, then Eq. 5)
        positional = {id(m) for layer in self.local_layers for m in layer.modules()}
        # DeiT's trunc_normal_(std=0.02) truncates at ±2, i.e. 100 standard deviations: it is a plain normal,
        # which normal_ samples many times faster
        for module in self.modules():
            if isinstance(module, nn.Linear) and id(module) not in positional:
                nn.init.normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        for token in (self.pos_embed, self.cls_token, getattr(self, "dist_token", None)):
            if token is not None:
                nn.init.normal_(token, std=0.02)
        for attn in self.local_layers:
            if c.freeze_gating:
                attn.gating_param.zero_()
                attn.gating_param.requires_grad_(False)
            if c.freeze_gpsa:
                attn.requires_grad_(False)

    def no_weight_decay(self) -> set[str]:
        """Parameters AdamW should not decay (DeiT recipe): the positional embedding and the extra tokens."""
        return {"pos_embed", "cls_token"} | ({"dist_token"} if self.config.distilled else set())

    def _prefix_tokens(self, batch: int) -> Tensor:
        tokens = [self.cls_token] + ([self.dist_token] if self.config.distilled else [])
        return torch.cat(tokens, dim=1).expand(batch, -1, -1)

    def _pos_embed_for(self, grid: tuple[int, int]) -> Tensor:
        c = self.config
        prefix_slots = c.num_prefix_tokens if c.class_token_pos_embed else 0
        return resize_pos_embed(self.pos_embed, c.grid_size, grid, num_prefix_tokens=prefix_slots)

    def forward_features(
        self, x: Tensor, return_attention: bool = False, return_block_inputs: bool = False
    ) -> Tensor | ForwardRecord:
        """Normalized output tokens (B, P + L, D), class token first; a ``ForwardRecord`` when asked for the
        per-block attention weights or inputs (one forward pass either way)."""
        c = self.config
        tokens, grid = self.patch_embed(x)
        prefix = self._prefix_tokens(tokens.shape[0])
        joined = c.class_token_pos_embed  # DeiT: the class token joins at the input, with its own pos slot
        if joined:
            tokens = torch.cat([prefix, tokens], dim=1)
        if not self.mask_pos_embed:
            tokens = tokens + self._pos_embed_for(grid)
        tokens = self.pos_drop(tokens)
        attentions, inputs, num_prefix = [], [], []
        for i, block in enumerate(self.blocks):
            if not joined and i == c.local_up_to_layer:  # ConViT: after the last GPSA block (Fig. 4)
                tokens, joined = torch.cat([prefix, tokens], dim=1), True
            num_prefix.append(prefix.shape[1] if joined else 0)
            if return_block_inputs:
                inputs.append(tokens)
            if return_attention:
                tokens, attn = block(tokens, grid, return_attention=True)
                attentions.append(attn)
            else:
                tokens = block(tokens, grid)
        tokens = self.norm(tokens)
        if not (return_attention or return_block_inputs):
            return tokens
        return ForwardRecord(
            features=tokens, grid_size=grid, num_prefix_tokens=num_prefix,
            attentions=attentions if return_attention else None,
            block_inputs=inputs if return_block_inputs else None,
        )

    def forward(self, x: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        features = self.forward_features(x)
        logits = self.head(features[:, 0])
        if not self.config.distilled:
            return logits
        dist_logits = self.head_dist(features[:, 1])
        return (logits, dist_logits) if self.training else (logits + dist_logits) / 2


# %% [markdown]
# ## The zoo
#
# Table 1 compares six sizes of each architecture. ConViT-Ti/S/B use 4, 9 and 16 heads (2×2, 3×3 and 4×4
# "kernels") of width 48, to stay close in size to DeiT-Ti/S/B with 3, 6 and 12 heads of width 64. The "+"
# models give both architectures the same heads, of width 64. All have 12 blocks; the ConViTs have 10 GPSA
# layers, α = 1 and no qkv bias; the DeiTs have qkv bias and a class token from the start.
# `create_model(name, **overrides)` returns a fresh model, any config field can be overridden.

# %%
#| export
from dataclasses import replace

from convit_edu.checks import one_of

_CONVIT = dict(local_up_to_layer=10, locality_strength=1.0, qkv_bias=False)
_DEIT = dict(local_up_to_layer=0, qkv_bias=True, class_token_pos_embed=True)

MODEL_ZOO: dict[str, ModelConfig] = {  # Table 1: (num_heads, embed_dim); depth 12, patch 16, 224 px
    "convit_tiny": ModelConfig(num_heads=4, embed_dim=192, **_CONVIT),
    "convit_small": ModelConfig(num_heads=9, embed_dim=432, **_CONVIT),
    "convit_base": ModelConfig(num_heads=16, embed_dim=768, **_CONVIT),
    "convit_tiny_plus": ModelConfig(num_heads=4, embed_dim=256, **_CONVIT),
    "convit_small_plus": ModelConfig(num_heads=9, embed_dim=576, **_CONVIT),
    "convit_base_plus": ModelConfig(num_heads=16, embed_dim=1024, **_CONVIT),
    "deit_tiny": ModelConfig(num_heads=3, embed_dim=192, **_DEIT),
    "deit_small": ModelConfig(num_heads=6, embed_dim=384, **_DEIT),
    "deit_base": ModelConfig(num_heads=12, embed_dim=768, **_DEIT),
    "deit_tiny_plus": ModelConfig(num_heads=4, embed_dim=256, **_DEIT),
    "deit_small_plus": ModelConfig(num_heads=9, embed_dim=576, **_DEIT),
    "deit_base_plus": ModelConfig(num_heads=16, embed_dim=1024, **_DEIT),
}


def list_models() -> list[str]:
    """Names ``create_model`` knows, in the order of Table 1's sizes (ConViTs, then DeiTs)."""
    return list(MODEL_ZOO)


def model_config(name: str, **overrides) -> ModelConfig:
    """The ``ModelConfig`` of zoo model ``name`` with some fields replaced (validated again)."""
    one_of("model", name, list_models())
    unknown = sorted(set(overrides) - set(config_fields()))
    if unknown:
        raise TypeError(f"unknown config field(s) {unknown} for {name!r}; ModelConfig fields: {config_fields()}")
    return replace(MODEL_ZOO[name], **overrides)


def create_model(name: str, **overrides) -> VisionTransformer:
    """A freshly initialized zoo model, e.g. ``create_model("convit_small", num_classes=100, img_size=32,
    patch_size=4)``; any ``ModelConfig`` field can be overridden."""
    return VisionTransformer(model_config(name, **overrides))


# %%
print(f"{'name':<19}{'heads':>6}{'embed_dim':>10}{'head_dim':>9}{'GPSA':>6}{'qkv_bias':>9}")
for name in list_models():
    c = MODEL_ZOO[name]
    print(f"{name:<19}{c.num_heads:>6}{c.embed_dim:>10}{c.head_dim:>9}{c.local_up_to_layer:>6}{c.qkv_bias!s:>9}")
    expected = 64 if name.startswith("deit") or name.endswith("plus") else 48
    assert c.head_dim == expected and c.depth == 12
print(expect_error(lambda: create_model("convit_huge")))

# %% [markdown]
# Here is the whole ConViT-Ti. Note the ten `GPSA` blocks and the two `MHSA` blocks, and that the
# drop-path probability of the blocks would rise linearly (it is 0 here: `drop_path_rate` defaults to 0, the
# training recipe sets 0.1).

# %%
torch.manual_seed(0)
convit_ti = create_model("convit_tiny")
print(convit_ti)

# %% [markdown]
# A forward pass on two random images, and the class token: it is not among the tokens of the GPSA blocks, and
# joins for the last two.

# %%
images = torch.randn(2, 3, 224, 224)
convit_ti.eval()
with torch.no_grad():
    logits = convit_ti(images)
    record = convit_ti.forward_features(images, return_attention=True, return_block_inputs=True)
print("logits", tuple(logits.shape))
print("tokens entering each block:", [t.shape[1] for t in record.block_inputs])
print("prefix tokens per block:   ", record.num_prefix_tokens)
print("attention of block 0:", tuple(record.attentions[0].shape), "of block 11:", tuple(record.attentions[11].shape))
assert [t.shape[1] for t in record.block_inputs] == [196] * 10 + [197] * 2
torch.testing.assert_close(convit_ti.head(record.features[:, 0]), logits)

# %% [markdown]
# At initialization the GPSA heads attend like the taps of a 2×2 convolution kernel: here the attention of
# the four heads of block 0 for the query patch in the middle of the grid (row 7, column 7, red square). Head
# h centres its positional attention at the query + Δ_h, and with 4 heads the centres Δ = (±½, ±½) lie between
# patches, so each head spreads its attention over the 2×2 patches around its centre: the four heads cover
# the four 2×2 squares that contain the query. (σ(λ = 1) = 0.73 of the attention is positional; the rest, the
# content part, is nearly uniform at initialization.)

# %%
query = 7 * 14 + 7
maps = record.attentions[0][0, :, query].reshape(4, 14, 14)
fig, axes = plt.subplots(1, 4, figsize=(8, 2.2), dpi=80)
for h, ax in enumerate(axes):
    ax.imshow(maps[h], cmap="viridis")
    ax.scatter([7], [7], marker="s", facecolors="none", edgecolors="red", s=40)
    ax.set_title(f"head {h}")
    ax.axis("off")
fig.suptitle("ConViT-Ti at initialization: block 0, attention of the centre patch")
plt.show()

# %%
from convit_edu.conv_init import head_centres

for h, (dx, dy) in enumerate(head_centres(4).tolist()):
    top4 = sorted(divmod(int(k), 14) for k in maps[h].flatten().topk(4).indices)  # (row, col) of the keys
    square = sorted((int(7 + dy + a), int(7 + dx + b)) for a in (-0.5, 0.5) for b in (-0.5, 0.5))
    print(f"head {h}: centre Δ = ({dx:+.1f}, {dy:+.1f}), its 4 strongest keys (row, col) {top4}")
    assert top4 == square
gates = convit_ti.gates()
assert torch.equal(gates, torch.full((10, 4), torch.sigmoid(torch.tensor(1.0)).item()))
print(f"gates(): σ(λ) of {gates.shape[0]} GPSA layers x {gates.shape[1]} heads, all σ(1) = {gates[0, 0]:.4f}")


# %% [markdown]
# ## Counting parameters
#
# Every parameter of these models sits in a few places, and counting them by hand is a good check that the
# architecture is the paper's. With D = `embed_dim`, N_h heads, L patches, C input channels, p the patch size,
# K classes and an MLP of width 4D:
#
# | part | parameters |
# |---|---|
# | patch embedding | D·C·p² + D |
# | `pos_embed`, `cls_token` | (L + class slot)·D, D |
# | MHSA (qkv bias b) | 3D² + 3bD + D² + D |
# | GPSA | 2D² (`qk`) + D² (`v`) (+ 3bD) + D² + D (`proj`) + 3N_h + N_h (`pos_proj`) + N_h (`gating_param`) |
# | MLP, two LayerNorms per block | 8D² + 5D, 4D |
# | final norm, head | 2D, D·K + K |
#
# A GPSA layer has exactly the parameters of an MHSA layer without qkv bias, plus 5N_h: the positional
# embeddings v_pos of the heads, their biases, and the gates.

# %%
#| export
def count_params(config: ModelConfig) -> int:
    """Number of parameters of the model ``config`` describes, counted analytically (trainable or not)."""
    c = config
    d, bias = c.embed_dim, int(c.qkv_bias)
    hidden = int(d * c.mlp_ratio)
    prefix_slots = c.num_prefix_tokens if c.class_token_pos_embed else 0
    total = d * c.in_chans * c.patch_size**2 + d  # patch embedding
    total += (prefix_slots + c.num_patches) * d + c.num_prefix_tokens * d  # pos_embed, cls (+ dist) token
    mhsa = 3 * d * d + 3 * bias * d + d * d + d
    positional = mhsa + 4 * c.num_heads + (c.num_heads if c.local_attention != "psa" else 0)
    mlp_and_norms = d * hidden + hidden + hidden * d + d + 4 * d
    total += c.local_up_to_layer * positional + (c.depth - c.local_up_to_layer) * mhsa + c.depth * mlp_and_norms
    total += 2 * d + (d * c.num_classes + c.num_classes) * (1 + int(c.distilled))  # final norm, head(s)
    return total


# %% [markdown]
# The reference counts (1000 classes, 224 px) of the official models: ConViT-Ti/S/B and DeiT-Ti/S/B. The
# analytic count must equal them exactly, and so must the parameters of the models we build. Building the
# Base models takes seconds of initialization, so we build them on PyTorch's `meta` device, which allocates
# nothing and only records shapes (without the convolutional initialization, which writes values that meta
# tensors do not have; it changes no shape).

# %%
REFERENCE_PARAMS = {
    "convit_tiny": 5_710_512, "convit_small": 27_777_322, "convit_base": 86_540_040,
    "deit_tiny": 5_717_416, "deit_small": 22_050_664, "deit_base": 86_567_656,
}
for name, expected in REFERENCE_PARAMS.items():
    with torch.device("meta"):
        built = sum(p.numel() for p in create_model(name, use_local_init=False).parameters())
    analytic = count_params(MODEL_ZOO[name])
    print(f"{name:<13} analytic {analytic:>11,}  built {built:>11,}  reference {expected:>11,}")
    assert analytic == built == expected, name

one_gpsa = sum(p.numel() for p in convit_ti.blocks[0].attn.parameters())
one_mhsa_no_bias = sum(p.numel() for p in convit_ti.blocks[11].attn.parameters())
print(f"one GPSA layer of ConViT-Ti: {one_gpsa:,} parameters, one MHSA layer (no qkv bias): {one_mhsa_no_bias:,}")
assert (one_gpsa, one_mhsa_no_bias) == (147_668, 147_648) and one_gpsa - one_mhsa_no_bias == 5 * 4

# %% [markdown]
# ## Counting multiply-accumulates
#
# Table 1's "Flops" column counts multiply-accumulates (MACs) per 224×224 image. We count them analytically,
# layer by layer, for L tokens of width D:
#
# * **linear layers**: the patch embedding (L·D·C·p²), per block 4·L·D² for the attention projections
#   (`qkv` + `proj`, or `qk` + `v` + `proj`), 2·L·D·4D for the MLP, the positional scores of a GPSA layer
#   (L²·3·N_h: `pos_proj` applied to `rel_indices`), and the head (D·K);
# * **LayerNorms**: we count 5 operations per element, the convention of the fvcore counter;
# * **attention matmuls**: Q·Kᵀ and A·V, 2·L²·D per layer (GPSA mixes its two attention maps into one matrix
#   before multiplying V, as the official code does; the fast path of chapter 04 spends one more L²·D on P·V).
#
# In the GPSA blocks L = 196 patches; after the class token joins, L = 197.

# %%
#| export
from dataclasses import dataclass


@dataclass(frozen=True)
class MacCount:
    """Multiply-accumulates of one forward pass of one image: ``linear`` (patch embedding, every Linear layer,
    the GPSA positional scores), ``norm`` (LayerNorms, 5 ops per element as fvcore counts them) and
    ``attention`` (Q·Kᵀ and A·V, 2·L²·D per layer)."""

    linear: int
    norm: int
    attention: int

    def total(self, with_attention: bool = True) -> int:
        return self.linear + self.norm + (self.attention if with_attention else 0)


def count_macs(config: ModelConfig, img_size: int | tuple[int, int] | None = None) -> MacCount:
    """Analytic ``MacCount`` of the model ``config`` describes, on images of ``img_size`` (default: the
    config's). FLOP counters miss the attention matmuls of a fused ``scaled_dot_product_attention``; this
    count does not."""
    c = config if img_size is None else replace(config, img_size=img_size)
    d, hidden, patches = c.embed_dim, int(c.embed_dim * c.mlp_ratio), c.num_patches
    linear = patches * d * c.in_chans * c.patch_size**2
    norm = attention = 0
    for i in range(c.depth):
        positional = i < c.local_up_to_layer
        length = patches if positional else patches + c.num_prefix_tokens
        linear += 4 * length * d * d + 2 * length * d * hidden
        linear += length * length * 3 * c.num_heads if positional else 0
        attention += 2 * length * length * d
        norm += 2 * 5 * length * d
    final_tokens = patches + c.num_prefix_tokens
    norm += 5 * final_tokens * d
    linear += d * c.num_classes * (1 + int(c.distilled))
    return MacCount(linear=linear, norm=norm, attention=attention)


# %% [markdown]
# ### Table 1, Size and Flops
#
# The paper prints "Flops" at a precision that varies ("4.3G", "17G"); we check our count against each printed
# value at its own precision: |ours − printed| ≤ half a unit of its last digit. Its Size column is looser (the
# released ConViT-S has 27.78 M parameters, printed "27M"; the ConViT-Ti's 5.71 M are printed "6M"), so for
# sizes we show the relative difference; the exact counts of the released models were checked above.

# %%
TABLE_1 = [  # (name, model, heads, embed_dim, size, flops) as printed in the paper
    ("Ti", "DeiT", 3, 192, "6M", "1G"), ("Ti", "ConViT", 4, 192, "6M", "1G"),
    ("Ti+", "DeiT", 4, 256, "10M", "2G"), ("Ti+", "ConViT", 4, 256, "10M", "2G"),
    ("S", "DeiT", 6, 384, "22M", "4.3G"), ("S", "ConViT", 9, 432, "27M", "5.4G"),
    ("S+", "DeiT", 9, 576, "48M", "10G"), ("S+", "ConViT", 9, 576, "48M", "10G"),
    ("B", "DeiT", 12, 768, "86M", "17G"), ("B", "ConViT", 16, 768, "86M", "17G"),
    ("B+", "DeiT", 16, 1024, "152M", "30G"), ("B+", "ConViT", 16, 1024, "152M", "30G"),
]
SIZES = {"Ti": "tiny", "Ti+": "tiny_plus", "S": "small", "S+": "small_plus", "B": "base", "B+": "base_plus"}


def matches_printed(value: float, printed: str) -> bool:
    """Does ``value`` round to the number printed in the paper, at the paper's precision?"""
    number = printed[:-1]
    half_unit = 0.5 * 10 ** -(len(number.split(".")[1]) if "." in number else 0)
    return abs(value - float(number)) <= half_unit + 1e-9


print(f"{'':<4}{'model':<7}{'Nh':>3}{'D':>6} |{'params':>8}{'paper':>6}{'diff':>7} |{'GMACs':>7}{'paper':>6}"
      f"{'+attn':>7}{'linear':>8}")
flops_differ, size_diffs = [], []
for size, arch, heads, dim, paper_size, paper_flops in TABLE_1:
    cfg = MODEL_ZOO[f"{arch.lower()}_{SIZES[size]}"]
    assert (cfg.num_heads, cfg.embed_dim) == (heads, dim)
    params, macs = count_params(cfg) / 1e6, count_macs(cfg)
    gmacs = macs.total(with_attention=False) / 1e9
    size_diffs.append(params / float(paper_size[:-1]) - 1)
    flag = "" if matches_printed(gmacs, paper_flops) else "  <- differs"
    print(f"{size:<4}{arch:<7}{heads:>3}{dim:>6} |{params:>7.2f}M{paper_size:>6}{size_diffs[-1]:>+7.1%} |{gmacs:>7.2f}"
          f"{paper_flops:>6}{macs.total() / 1e9:>7.2f}{macs.linear / 1e9:>8.2f}{flag}")
    if flag:
        flops_differ.append((size, arch))
print("Flops entries that differ from the paper:", flops_differ)
assert flops_differ == [("S+", "ConViT")] and max(abs(d) for d in size_diffs) < 0.05
small, deit_small = count_macs(MODEL_ZOO["convit_small"]), count_macs(MODEL_ZOO["deit_small"])
assert round(small.total(False) / 1e9, 2) == 5.36 and round(small.total() / 1e9, 2) == 5.76
assert not matches_printed(small.linear / 1e9, "5.4G") and not matches_printed(deit_small.linear / 1e9, "4.3G")

# %% [markdown]
# "GMACs" is our count without the attention matmuls, "+attn" with them, "linear" without the LayerNorms.
# Every Flops entry matches but one: the ConViT-S+ needs 9.48 GMACs, which the paper prints as "10G" — the
# value of its DeiT-S+ partner (9.51 G), which its GPSA layers undercut a little because their 196 patch
# tokens carry no class token. The LayerNorms matter for the rounding: the linear layers alone give 5.35 G and
# 4.24 G for ConViT-S and DeiT-S, which would print as 5.3G and 4.2G, so the paper's counter included them.
# With the attention matmuls ConViT-S costs 5.76 GMACs instead of 5.36: the column leaves out about 7% of the
# work, and more at higher resolution, where attention grows with L² and everything else with L.
#
# ### Why not just use a FLOP counter?
#
# PyTorch's `FlopCounterMode` counts the matrix multiplications it sees (in FLOPs, 2 per MAC). On a DeiT-Ti it
# counts every linear layer, but the fused `scaled_dot_product_attention` of our MHSA layers contributes
# nothing on this CPU: the counter's blind spot. On a ConViT-Ti what it sees depends on the code path: the
# reference GPSA materializes the attention, so the counter sees its Q·Kᵀ and A·V (2·L²·D per GPSA layer);
# the fast GPSA hides Q·Kᵀ and A·V in SDPA and the counter sees only its P·V (L²·D). The analytic count does
# not depend on how the attention is computed.

# %%
from torch.utils.flop_counter import FlopCounterMode


def counted_macs(model: torch.nn.Module, images: torch.Tensor) -> int:
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(images)
    return counter.get_total_flops() // 2 // images.shape[0]


torch.manual_seed(0)
deit_ti = create_model("deit_tiny").eval()
one_image = torch.randn(1, 3, 224, 224)
macs = count_macs(deit_ti.config)
counted = counted_macs(deit_ti, one_image)
print(f"DeiT-Ti: counter {counted / 1e9:.4f} G | analytic linear {macs.linear / 1e9:.4f} G, "
      f"attention {macs.attention / 1e9:.4f} G")
assert counted == macs.linear  # the counter sees every linear layer and no attention at all

gpsa_matmul = 196 * 196 * 192  # one L x L by L x D product of one GPSA layer of ConViT-Ti
for path, seen in (("gpsa_reference", 2), ("gpsa", 1)):
    model = create_model("convit_tiny", local_attention=path).eval()
    counted, linear = counted_macs(model, one_image), count_macs(model.config).linear
    print(f"ConViT-Ti, {path:<14}: counter {counted / 1e9:.4f} G = linear {linear / 1e9:.4f} G "
          f"+ {(counted - linear) // gpsa_matmul} x L²·D")
    assert counted == linear + 10 * seen * gpsa_matmul

# %% [markdown]
# ## Other resolutions and aspect ratios
#
# A model built for 224 px runs on any image whose sides are multiples of the patch size: `PatchEmbed` returns
# the grid, GPSA layers rebuild `rel_indices` for it (H×W, not only square), and `pos_embed` is interpolated.
# To *train* at another size, build the model for it (`img_size=160`): `pos_embed` then has a slot per patch of
# that grid and nothing is interpolated. CIFAR-100 works either way: upsampled to 224, or at 32 px with
# patch size 4 (an 8×8 grid).

# %%
torch.manual_seed(0)
for size in [(160, 160), (288, 288), (224, 160)]:
    with torch.no_grad():
        out = convit_ti(torch.randn(1, 3, *size))
    grids = {tuple(b.attn.rel_indices.shape[-3:]) for b in convit_ti.blocks[:10]}
    print(f"image {size[0]}x{size[1]}: logits {tuple(out.shape)}, rel_indices of the GPSA layers {grids}")
    rows, cols = size[0] // 16, size[1] // 16
    assert out.shape == (1, 1000) and grids == {(rows * cols, rows * cols, 3)}

cifar = create_model("convit_tiny", img_size=32, patch_size=4, num_classes=100).eval()
with torch.no_grad():
    out = cifar(torch.randn(2, 3, 32, 32))
print("CIFAR ConViT-Ti, 32 px, patch 4:", tuple(out.shape), "pos_embed", tuple(cifar.pos_embed.shape))
assert out.shape == (2, 100) and cifar.pos_embed.shape == (1, 64, 192)

for bad in [torch.randn(1, 3, 225, 224), torch.randn(1, 1, 224, 224)]:
    print(expect_error(lambda: convit_ti(bad)))

# %% [markdown]
# ## Loading official checkpoints
#
# The official ConViT release and timm's `convit_*` and `deit_*` models store their weights under the names
# our modules have, so loading is mostly `load_state_dict`. `load_checkpoint` adds what real files need:
#
# * `read_state_dict` turns every source into a plain state dict: it reads a path or takes a mapping; it unwraps
#   the `{"model": ...}` (or `"state_dict"`) of the official releases and of our training checkpoints, strips
#   the `module.` / `_orig_mod.` prefixes that DDP, `torch.compile` and an EMA `AveragedModel` add, drops the
#   EMA's `n_averaged` counter, and ignores `rel_indices` (derived from the grid, rebuilt on demand);
# * a checkpoint for another image size has its `pos_embed` interpolated to the model's grid (DeiT's class
#   and distillation slots are kept as they are) — fine-tuning at 288 px from a 224 px checkpoint;
# * `ignore_head=True` leaves the model's own head(s), to fine-tune on another number of classes;
# * anything else that does not fit is an error that names the key, both shapes, and which model the
#   checkpoint looks like (`guess_architecture`).
#
# One thing a state dict cannot tell is the number of heads of an MHSA layer (its `qkv` weight is 3D×D for
# any split into heads); GPSA layers give it away through `pos_proj`.

# %%
#| export
import argparse
import math
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

_WRAPPERS = ("model", "state_dict")
_PREFIXES = ("module.", "_orig_mod.")
_NOT_WEIGHTS = ("n_averaged",)  # the number of models an EMA AveragedModel has averaged
_HEADS = ("head", "head_dist")


def load_file(path: str | Path) -> object:
    """``torch.load`` of a checkpoint file on the CPU, reading only tensors, numbers, strings and containers (no
    pickled code runs); errors say whether the file is missing, truncated or not a torch file, or holds objects
    that cannot be loaded safely."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint file at {path}")
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):  # official files may store their args
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch's own messages run on for lines and advise loading unsafely: say what it means
        if "Unsupported global" in str(e):
            raise ValueError(f"{path} holds Python objects that cannot be loaded safely (only tensors, numbers, "
                             "strings and containers are read): it was not written by convit-edu or timm") from None
        raise ValueError(f"{path} is truncated or not a torch checkpoint ({type(e).__name__})") from None


def read_state_dict(source: str | Path | Mapping) -> dict[str, Tensor]:
    """The plain state dict (parameter name -> tensor) of a checkpoint file or mapping: an official release or a
    ``convit-edu train`` checkpoint (``{"model": ...}`` / ``{"state_dict": ...}``), a timm or our own state
    dict, an EMA ``AveragedModel`` state dict; ``module.`` / ``_orig_mod.`` prefixes, ``n_averaged`` and
    ``rel_indices`` removed."""
    if isinstance(source, (str, Path)):
        source = load_file(source)
    if not isinstance(source, Mapping):
        raise TypeError(f"a checkpoint must be a path or a state dict (a mapping), got {type(source).__name__}")
    while any(isinstance(source.get(key), Mapping) for key in _WRAPPERS):
        source = next(source[key] for key in _WRAPPERS if isinstance(source.get(key), Mapping))
    state_dict = {}
    for key, value in source.items():
        if key in _NOT_WEIGHTS:
            continue
        if not isinstance(value, Tensor):
            raise ValueError(f"checkpoint entry {key!r} is a {type(value).__name__}, not a tensor")
        while key.startswith(_PREFIXES):
            key = key.split(".", 1)[1]
        if not key.endswith("rel_indices"):
            state_dict[key] = value
    return state_dict


def guess_architecture(state_dict: str | Path | Mapping) -> str:
    """A one-line description of the model a checkpoint belongs to, naming the zoo model it matches if any."""
    sd = read_state_dict(state_dict)
    if "patch_embed.proj.weight" not in sd or "pos_embed" not in sd:
        return f"not a ConViT/DeiT (no 'patch_embed.proj.weight' or 'pos_embed'; first keys {list(sd)[:4]})"
    embed_dim, _, patch_size, _ = sd["patch_embed.proj.weight"].shape
    blocks = sorted({int(k.split(".")[1]) for k in sd if k.startswith("blocks.")})
    depth = len(blocks)
    local = sum(f"blocks.{i}.attn.pos_proj.weight" in sd for i in blocks)
    heads = sd["blocks.0.attn.pos_proj.weight"].shape[0] if local else None
    qkv_bias = any(k.endswith(("attn.qkv.bias", "attn.qk.bias")) for k in sd)
    distilled = "dist_token" in sd
    slots = sd["pos_embed"].shape[1]
    patches = slots - (1 + int(distilled))
    class_slot = not local and patches > 0 and math.isqrt(patches) ** 2 == patches
    num_classes = sd["head.weight"].shape[0] if "head.weight" in sd else None
    details = (
        f"embed_dim {embed_dim}, depth {depth}, {local} GPSA layers"
        + (f", num_heads {heads}" if heads else "")
        + f", qkv_bias {qkv_bias}, patch_size {patch_size}, {slots} pos_embed slots, {num_classes} classes"
        + (", distilled" if distilled else "")
    )
    names = [
        name for name, c in MODEL_ZOO.items()
        if (c.embed_dim, c.depth, c.local_up_to_layer, c.qkv_bias, c.patch_size) == (embed_dim, depth, local, qkv_bias, patch_size)
        and heads in (None, c.num_heads) and c.class_token_pos_embed == class_slot
    ]
    return f"{names[0]} ({details})" if names else f"no zoo model ({details})"


def load_checkpoint(
    model: VisionTransformer, path_or_state_dict: str | Path | Mapping, *, ignore_head: bool = False
) -> VisionTransformer:
    """Load official ConViT / DeiT, timm ``convit_*`` / ``deit_*`` or our own weights into ``model``, in place.

    Reads the weights with ``read_state_dict`` (any checkpoint it accepts, EMA weights included), interpolates ``pos_embed`` bicubically to the model's grid (prefix slots untouched); with ``ignore_head``
    the model keeps its own ``head`` (and ``head_dist``). Raises a ValueError naming every key whose shape
    differs, is missing or is unexpected, and the model the checkpoint looks like. Returns ``model``.
    """
    sd = read_state_dict(path_or_state_dict)
    own = model.state_dict()
    c = model.config
    if ignore_head:
        sd = {k: v for k, v in sd.items() if k.split(".")[0] not in _HEADS}
    pos = sd.get("pos_embed")
    prefix_slots = c.num_prefix_tokens if c.class_token_pos_embed else 0
    if pos is not None and pos.ndim == 3 and pos.shape != own["pos_embed"].shape and pos.shape[-1] == c.embed_dim:
        side = math.isqrt(max(pos.shape[1] - prefix_slots, 0))
        if side > 0 and side * side == pos.shape[1] - prefix_slots:
            sd["pos_embed"] = resize_pos_embed(pos, (side, side), c.grid_size, num_prefix_tokens=prefix_slots)
    problems = [
        f"key {k!r}: checkpoint shape {tuple(v.shape)}, model shape {tuple(own[k].shape)}"
        for k, v in sd.items() if k in own and v.shape != own[k].shape
    ]
    missing = [k for k in own if k not in sd and not (ignore_head and k.split(".")[0] in _HEADS)]
    unexpected = [k for k in sd if k not in own]
    for label, keys in (("missing from the checkpoint", missing), ("unexpected in the checkpoint", unexpected)):
        if keys:
            problems.append(f"{label}: {keys[:6]}" + (f" and {len(keys) - 6} more" if len(keys) > 6 else ""))
    if problems:
        hint = ""
        if all(p.startswith(("key 'head.", "key 'head_dist.")) for p in problems):
            hint = "\n(to fine-tune on another number of classes, pass ignore_head=True)"
        raise ValueError(
            "the checkpoint does not fit this model:\n  " + "\n  ".join(problems)
            + f"\nthe checkpoint looks like: {guess_architecture(sd)}"
            + f"\nthe model is:              {guess_architecture(own)}" + hint
        )
    model.load_state_dict(sd, strict=not ignore_head)
    return model


# %% [markdown]
# A round trip through a file, in the format of the official releases, then the same weights loaded into a
# model built for 288 px: its interpolated `pos_embed` is exactly what the 224 px model computes on the fly for
# a 288 px image, so the two agree. (The tests load timm's models with random weights and compare logits.) Last,
# the weights of an EMA `AveragedModel` as a training checkpoint stores them: `read_state_dict` gives the model's
# own keys.

# %%
import tempfile

from torch.optim.swa_utils import AveragedModel

torch.manual_seed(0)
with tempfile.TemporaryDirectory() as folder:
    path = Path(folder) / "convit_tiny.pth"
    torch.save({"model": convit_ti.state_dict()}, path)
    fresh = load_checkpoint(create_model("convit_tiny"), path).eval()
    big = load_checkpoint(create_model("convit_tiny", img_size=288), path).eval()
x224, x288 = torch.randn(2, 3, 224, 224), torch.randn(2, 3, 288, 288)
with torch.no_grad():
    torch.testing.assert_close(fresh(x224), convit_ti(x224))
    torch.testing.assert_close(big(x288), convit_ti(x288))
print("pos_embed", tuple(convit_ti.pos_embed.shape), "-> 288 px model", tuple(big.pos_embed.shape))
print("checkpoint looks like:", guess_architecture(convit_ti.state_dict()))

ema_weights = AveragedModel(convit_ti).state_dict()  # what training keeps for EMA (chapter 07)
print("EMA state dict:", list(ema_weights)[:2], "... and", list(ema_weights)[-1])
assert read_state_dict(ema_weights).keys() == convit_ti.state_dict().keys()

# %% [markdown]
# And the error for a checkpoint of another model: the weights of a ConViT-S loaded into a ConViT-Ti.

# %%
with torch.device("meta"):
    small_weights = create_model("convit_small", use_local_init=False).state_dict()
message = expect_error(lambda: load_checkpoint(create_model("convit_tiny"), small_weights))
print("\n".join(message.splitlines()[:3] + ["  ..."] + message.splitlines()[-2:]))
assert "'blocks.0.attn.qk.weight': checkpoint shape (864, 432), model shape (384, 192)" in message
assert "looks like: convit_small" in message

# %% [markdown]
# ## Hard distillation
#
# DeiT's distilled models carry a second token, `dist_token`, next to the class token, and a second head,
# `head_dist`, trained against the hard labels of a CNN teacher (chapter 07). In training mode the model
# returns both logits; at test time the average of the two heads. In the ConViT the distillation token joins
# with the class token after the last GPSA layer; in the DeiT it has its own `pos_embed` slot.

# %%
torch.manual_seed(0)
for name in ("deit_tiny", "convit_tiny"):
    student = create_model(name, distilled=True, num_classes=10)
    images = torch.randn(2, 3, 96, 96)
    with torch.no_grad():
        class_logits, dist_logits = student.train()(images)
        averaged = student.eval()(images)
    torch.testing.assert_close(averaged, (class_logits + dist_logits) / 2)
    print(f"{name}: pos_embed {tuple(student.pos_embed.shape)}, no weight decay on {sorted(student.no_weight_decay())}")

# %% [markdown]
# ## Switches for the ablations
#
# The paper's ablations change one ingredient at a time. Each is a config field (set at construction) or, for
# the test-time experiments of SM F, the context manager `mask_at_test_time`:
#
# | experiment | switch |
# |---|---|
# | Table 3 [b]: no gating (λ frozen at 0) | `freeze_gating=True` |
# | Table 3 [c]: no convolutional initialization | `use_local_init=False` |
# | Fig. 12 "frozen": freeze the GPSA layers | `freeze_gpsa=True` |
# | Fig. 8, Table 3 [e]: number of GPSA layers (0 = DeiT-like) | `local_up_to_layer=k` |
# | App. A: PSA (Eq. 4) instead of GPSA | `local_attention="psa"` |
# | Table 5: mask the absolute positional embedding at test time | `mask_at_test_time(model, mask_pos_embed=True)` |
# | Table 6: σ(λ) forced to 1 (mask content) or 0 (mask position) in the first k layers | `mask_at_test_time(model, gate=1.0, num_layers=k)` |

# %%
#| export
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def mask_at_test_time(
    model: VisionTransformer, *, mask_pos_embed: bool = False, gate: float | None = None, num_layers: int | None = None
) -> Iterator[VisionTransformer]:
    """Evaluate ``model`` with parts masked off (SM F), restoring it on exit.

    ``mask_pos_embed`` drops the absolute positional embedding (Table 5). ``gate`` replaces σ(λ_h) of every
    head of the first ``num_layers`` GPSA layers (all of them if None) by a constant: 1.0 masks the content
    attention, 0.0 the positional attention (Table 6).
    """
    layers = model.gated_layers
    if gate is None:
        if num_layers is not None:
            raise ValueError(f"num_layers={num_layers} needs a gate value (1.0 masks content, 0.0 position)")
        chosen = []
    else:
        if not 0.0 <= gate <= 1.0:
            raise ValueError(f"gate replaces σ(λ) and must be in [0, 1], got {gate}")
        if not layers:
            raise ValueError(
                f"gate needs gated (GPSA) layers; this model has local_up_to_layer={model.config.local_up_to_layer}, "
                f"local_attention={model.config.local_attention!r}"
            )
        count = len(layers) if num_layers is None else num_layers
        if not 1 <= count <= len(layers):
            raise ValueError(f"num_layers {count} must be in [1, {len(layers)}] (the model's GPSA layers)")
        chosen = layers[:count]
    saved = model.mask_pos_embed, [layer.gate_override for layer in chosen]
    try:
        model.mask_pos_embed = mask_pos_embed
        for layer in chosen:
            layer.gate_override = gate
        yield model
    finally:
        model.mask_pos_embed = saved[0]
        for layer, value in zip(chosen, saved[1]):
            layer.gate_override = value


# %% [markdown]
# Checks of every switch, on ConViT-Ti-sized models. Freezing the gates at λ = 0 leaves 10·4 fewer trainable
# parameters; without the convolutional initialization `v` is no longer the identity; a frozen GPSA layer
# receives no gradient; 0 GPSA layers gives MHSA everywhere and a class token from the first block.

# %%
def trainable(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


torch.manual_seed(0)
frozen_gates = create_model("convit_tiny", freeze_gating=True)
assert all(not a.gating_param.requires_grad and a.gating_param.abs().sum() == 0 for a in frozen_gates.local_layers)
assert torch.equal(frozen_gates.gates(), torch.full((10, 4), 0.5))
assert trainable(convit_ti) - trainable(frozen_gates) == 10 * 4

no_init = create_model("convit_tiny", use_local_init=False)
assert not torch.equal(no_init.blocks[0].attn.v.weight, torch.eye(192))
assert torch.equal(convit_ti.blocks[0].attn.v.weight, torch.eye(192))

frozen = create_model("convit_tiny", freeze_gpsa=True)
frozen(torch.randn(1, 3, 64, 64)).sum().backward()
assert all(p.grad is None for a in frozen.local_layers for p in a.parameters())
assert frozen.blocks[0].mlp.fc1.weight.grad is not None and frozen.blocks[11].attn.qkv.weight.grad is not None

no_gpsa = create_model("convit_tiny", local_up_to_layer=0)
record = no_gpsa.forward_features(torch.randn(1, 3, 64, 64), return_block_inputs=True)
assert record.num_prefix_tokens == [1] * 12 and no_gpsa.pos_embed.shape == (1, 196, 192)

psa = create_model("convit_tiny", local_attention="psa")
assert not any(hasattr(a, "gating_param") for a in psa.local_layers) and psa.gates().shape == (0, 4)
print("trainable parameters: ConViT-Ti", f"{trainable(convit_ti):,}", "| frozen gates", f"{trainable(frozen_gates):,}",
      "| frozen GPSA", f"{trainable(frozen):,}", "| PSA", f"{trainable(psa):,}")

# %% [markdown]
# The reference path gives the fast path's logits with the same weights; and forcing σ(λ) = 1 with
# `mask_at_test_time` is the same as a gate parameter so large that σ(λ) rounds to 1; masking the positional
# embedding is the same as a model whose `pos_embed` is zero, changes the output by far more than float noise,
# and the model is restored afterwards.

# %%
torch.manual_seed(0)
images = torch.randn(2, 3, 96, 96)
reference = create_model("convit_tiny", local_attention="gpsa_reference").eval()
reference.load_state_dict(convit_ti.state_dict())
positional_only = create_model("convit_tiny").eval()
positional_only.load_state_dict(convit_ti.state_dict())
no_pos_embed = create_model("convit_tiny").eval()
no_pos_embed.load_state_dict(convit_ti.state_dict())
with torch.no_grad():
    for layer in positional_only.local_layers[:3]:
        layer.gating_param.fill_(100.0)  # σ(100) = 1 in float32
    no_pos_embed.pos_embed.zero_()
    base = convit_ti(images)
    torch.testing.assert_close(reference(images), base, atol=1e-5, rtol=1e-5)
    with mask_at_test_time(convit_ti, gate=1.0, num_layers=3):
        torch.testing.assert_close(convit_ti(images), positional_only(images), atol=1e-5, rtol=1e-5)
        assert (convit_ti.gates()[:3] == 1).all() and (convit_ti.gates()[3:] < 1).all()
    with mask_at_test_time(convit_ti, mask_pos_embed=True):
        masked = convit_ti(images)
    torch.testing.assert_close(masked, no_pos_embed(images), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(convit_ti(images), base)
assert (masked - base).abs().max() > 1e-3  # 100x the tolerance of the comparisons above
print("masked positional embedding = a zero pos_embed; the logits move by more than 1e-3; model restored")

# %% [markdown]
# ## Exercises
#
# **1. Where the class token joins.** In `convit_tiny` at 224 px (10 GPSA blocks, then 2 SA blocks), how many
# tokens does the attention of block 1 see, and of block 12? Set `tokens_block_1, tokens_block_12` without
# running the model.

# %% tags=["solution"] jupyter={"source_hidden": true}
tokens_block_1, tokens_block_12 = 196, 197  # 14 × 14 patches; the class token joins after the last GPSA block

# %%
# your answer: tokens_block_1, tokens_block_12 = ..., ...

# %%
from convit_edu.checks import WrongAnswer, check_answer


def check_tokens(answer: tuple[int, int]) -> None:
    with torch.no_grad():
        record = create_model("convit_tiny").eval().forward_features(torch.zeros(1, 3, 224, 224), return_attention=True)
    want = (record.attentions[0].shape[-1], record.attentions[-1].shape[-1])
    check_answer(answer[0] == want[0], "block 1 sees the patches of a 224-px image cut into 16-px patches — and "
                 "is there a class token yet?")
    check_answer(answer[1] == want[1], "by block 12 something has joined the patches")


check_tokens((tokens_block_1, tokens_block_12))
print(expect_error(lambda: check_tokens((197, 197)), WrongAnswer))

# %% [markdown]
# **2. ConViT-Ti against DeiT-Ti, parameter by parameter.** The two have the same width, depth and MLPs. Predict
# `difference` = (parameters of `convit_tiny`) − (parameters of `deit_tiny`) from what differs: the GPSA
# layers' extra parameters (chapter 04), the attention biases (the official ConViT has no qkv bias, DeiT has),
# and the positional embedding (who has a slot for the class token?).

# %% tags=["solution"] jupyter={"source_hidden": true}
D, heads, gpsa_layers, depth, patches = 192, 4, 10, 12, 196
difference = (gpsa_layers * (3 * heads + heads + heads)  # v_pos weights and biases, λ, per GPSA layer
              - depth * 3 * D  # DeiT's qkv biases
              - D)  # DeiT's positional embedding also covers the class token: 197 × D against 196 × D

# %%
# your answer: difference = ...

# %%
def check_difference(answer: int) -> None:
    want = count_params(model_config("convit_tiny")) - count_params(model_config("deit_tiny"))
    check_answer(answer == want, f"not quite: {'too high' if answer > want else 'too low'}. Per GPSA layer: "
                 "pos_proj (3 -> N_h, with bias) and one λ per head; per DeiT block: the qkv bias (3·D); and "
                 "one positional embedding slot of width D")


check_difference(difference)
print(f"ConViT-Ti has {-difference:,} parameters fewer than DeiT-Ti")
print(expect_error(lambda: check_difference(gpsa_layers * 5 * heads), WrongAnswer))
