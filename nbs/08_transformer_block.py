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
# # The transformer block: MLP, stochastic depth, pre-norm
#
# Chapters 01-07 built the attention layers, DeiT's `MHSA` and the ConViT's `GPSA`, and the previous chapter
# (`08_patches_and_tokens`) the tokens they read. This chapter builds the block that holds any of those attentions:
# the MLP, stochastic depth and the pre-norm block. Chapter 09 assembles patches and blocks into the ConViT of Fig. 4
# and its DeiT baseline.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp layers
# The layers of a transformer block: the MLP, stochastic depth, and the pre-norm block that holds any attention.

# %%
import matplotlib.pyplot as plt
import torch

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

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
# How they work (chapter 00_input_checks): replace the placeholder `...` in the answer cell and run the check under it.
#
# **1. One DeiT-Ti block, parameter by parameter.** A block of DeiT-Ti: width D = 192, 3 heads, MLP ratio 4,
# `MHSA` with qkv bias. Count its parameters by hand — the two LayerNorms, the qkv and output projections, the
# MLP's two linear maps — and set `block_params`.

# %%
block_params = ...  # your answer: block_params = ...

# %%
from convit_edu.checks import check_answer, demonstrate, grade, reveal


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
# **2. The block, yours.** Write `my_block(block, x, grid)`: the output of the pre-norm block `block` (in eval mode,
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
