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
# # The model zoo: Table 1 by name, counted
#
# Chapter 09 built a `VisionTransformer` from a `ModelConfig`. We name Table 1's twelve models (ConViT and DeiT, Ti/S/B
# and "+") and check their parameters and multiply-accumulates against its Size and Flops. The next chapter
# (`10_zoo_variants`) runs them at other resolutions and switches their parts off, for the ablations (Table 3, App. A)
# and test-time masking (Tables 5-6).

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
#| default_exp zoo
# The ConViT and DeiT zoo by name, and their parameter and multiply-accumulate counts (Table 1).

# %%
#| export
from dataclasses import dataclass, replace

from convit_edu.checks import one_of
from convit_edu.models import ModelConfig, VisionTransformer, config_fields

# %%
import matplotlib.pyplot as plt
import torch

from convit_edu.checks import check_answer
from convit_edu.conv_init import head_centres

torch.set_printoptions(precision=4, sci_mode=False)
_ = torch.manual_seed(0)

# %% [markdown]
# ## The zoo
#
# Table 1 compares six sizes of each architecture. ConViT-Ti/S/B use 4, 9 and 16 heads (2×2, 3×3 and 4×4 "kernels") of
# width 48, close in size to DeiT-Ti/S/B with 3, 6 and 12 heads of width 64. The "+" models give both the same heads,
# of width 64. All have 12 blocks; the ConViTs have 10 GPSA layers, α = 1 and no qkv bias; the DeiTs have qkv bias and
# a class token from the start. `create_model(name, **overrides)` returns a fresh model, any config field overridden.

# %%
#| export
_CONVIT = dict(local_up_to_layer=10, locality_strength=1.0, qkv_bias=False)
_DEIT_MODEL = dict(local_up_to_layer=0, qkv_bias=True, class_token_pos_embed=True)

MODEL_ZOO: dict[str, ModelConfig] = {  # Table 1: (num_heads, embed_dim); depth 12, patch 16, 224 px
    "convit_tiny": ModelConfig(num_heads=4, embed_dim=192, **_CONVIT),
    "convit_small": ModelConfig(num_heads=9, embed_dim=432, **_CONVIT),
    "convit_base": ModelConfig(num_heads=16, embed_dim=768, **_CONVIT),
    "convit_tiny_plus": ModelConfig(num_heads=4, embed_dim=256, **_CONVIT),
    "convit_small_plus": ModelConfig(num_heads=9, embed_dim=576, **_CONVIT),
    "convit_base_plus": ModelConfig(num_heads=16, embed_dim=1024, **_CONVIT),
    "deit_tiny": ModelConfig(num_heads=3, embed_dim=192, **_DEIT_MODEL),
    "deit_small": ModelConfig(num_heads=6, embed_dim=384, **_DEIT_MODEL),
    "deit_base": ModelConfig(num_heads=12, embed_dim=768, **_DEIT_MODEL),
    "deit_tiny_plus": ModelConfig(num_heads=4, embed_dim=256, **_DEIT_MODEL),
    "deit_small_plus": ModelConfig(num_heads=9, embed_dim=576, **_DEIT_MODEL),
    "deit_base_plus": ModelConfig(num_heads=16, embed_dim=1024, **_DEIT_MODEL),
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
    assert c.head_dim == (64 if name.startswith("deit") or name.endswith("plus") else 48) and c.depth == 12

# %% [markdown]
# Here is the whole ConViT-Ti: ten `GPSA` blocks, then two `MHSA` blocks (drop path 0: `drop_path_rate` defaults to 0,
# the training recipe sets 0.1). On two random images, the class token skips the GPSA blocks and joins for the last
# two. At initialization every GPSA head leans on a 2×2 block of patches without averaging it: for the centre patch
# (row 7, column 7), the four strongest keys of head h in block 0 are the 2×2 patches around its centre query + Δ_h,
# Δ = (±½, ±½), and they get about 0.57 of its attention, not all of it. σ(λ = 1) = 0.73 of every head's attention
# is positional, and at α = 1 the positional softmax itself spreads beyond the block; the content part, 0.27, is
# nearly uniform at initialization. Chapter 04 computes the same 0.57 with a content part exactly uniform; the cell
# measures it on the model, within 0.01 of that value, for both images.

# %%
torch.manual_seed(0)
convit_ti = create_model("convit_tiny").eval()
print(convit_ti)
images = torch.randn(2, 3, 224, 224)
with torch.no_grad():
    logits = convit_ti(images)
    record = convit_ti.forward_features(images, return_attention=True, return_block_inputs=True)
print("logits", tuple(logits.shape), "| tokens entering each block:", [t.shape[1] for t in record.block_inputs])
print("prefix tokens per block:   ", record.num_prefix_tokens)
print("attention of block 0:", tuple(record.attentions[0].shape), "of block 11:", tuple(record.attentions[11].shape))
assert [t.shape[1] for t in record.block_inputs] == [196] * 10 + [197] * 2
torch.testing.assert_close(convit_ti.head(record.features[:, 0]), logits)
maps = record.attentions[0][0, :, 7 * 14 + 7].reshape(4, 14, 14)  # the centre query: row 7, column 7
gates = convit_ti.gates()
assert torch.equal(gates, torch.full((10, 4), torch.sigmoid(torch.tensor(1.0)).item()))
sigma = gates[0, 0].item()
positional = convit_ti.blocks[0].attn.positional_softmax((14, 14))[:, 7 * 14 + 7].reshape(4, 14, 14).detach()
for h, (dx, dy) in enumerate(head_centres(4).tolist()):
    top4 = sorted(divmod(int(k), 14) for k in maps[h].flatten().topk(4).indices)  # (row, col) of the keys
    square = sorted((int(7 + dy + a), int(7 + dx + b)) for a in (-0.5, 0.5) for b in (-0.5, 0.5))
    rows, cols = zip(*square)
    uniform_content = sigma * positional[h][rows, cols].sum().item() + (1 - sigma) * 4 / 196  # chapter 04's
    shares = record.attentions[0][:, h, 7 * 14 + 7].reshape(2, 14, 14)[:, rows, cols].sum(-1)  # both images
    print(f"head {h}: centre Δ = ({dx:+.1f}, {dy:+.1f}), its 4 strongest keys (row, col) {top4}, "
          f"{uniform_content:.2f} of its attention on them")
    assert top4 == square and (shares - uniform_content).abs().max() < 0.01 and 0.5 < uniform_content < 0.65
print(f"gates(): σ(λ) of {gates.shape[0]} GPSA layers x {gates.shape[1]} heads, all σ(1) = {sigma:.4f}")

# %% [markdown]
# ## Counting parameters
#
# Every parameter sits in a few places, and counting them by hand is a good check that the architecture is the
# paper's. With D = `embed_dim`, N_h heads, L patches, C channels, p the patch size, K classes and an MLP of width 4D:
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
    d, bias, hidden = c.embed_dim, int(c.qkv_bias), int(c.embed_dim * c.mlp_ratio)
    total = d * c.in_chans * c.patch_size**2 + d  # patch embedding
    total += (c.pos_embed_prefix_slots + c.num_patches) * d + c.num_prefix_tokens * d  # pos_embed, cls (+ dist) token
    mhsa = 3 * d * d + 3 * bias * d + d * d + d
    positional = mhsa + 4 * c.num_heads + (c.num_heads if c.local_attention != "psa" else 0)
    mlp_and_norms = d * hidden + hidden + hidden * d + d + 4 * d
    total += c.local_up_to_layer * positional + (c.depth - c.local_up_to_layer) * mhsa + c.depth * mlp_and_norms
    total += 2 * d + (d * c.num_classes + c.num_classes) * (1 + int(c.distilled))  # final norm, head(s)
    return total


# %% [markdown]
# The official models' parameter counts (1000 classes, 224 px), ConViT-Ti/S/B and DeiT-Ti/S/B, must equal our analytic
# count, and so must the models we build. Initializing the Base models takes seconds, so we build them on PyTorch's
# `meta` device, which only records shapes (without the convolutional initialization, which only writes values).

# %%
REFERENCE_PARAMS = {"convit_tiny": 5_710_512, "convit_small": 27_777_322, "convit_base": 86_540_040,
                    "deit_tiny": 5_717_416, "deit_small": 22_050_664, "deit_base": 86_567_656}
for name, expected in REFERENCE_PARAMS.items():
    with torch.device("meta"):
        built = sum(p.numel() for p in create_model(name, use_local_init=False).parameters())
    analytic = count_params(MODEL_ZOO[name])
    print(f"{name:<13} analytic {analytic:>11,}  built {built:>11,}  reference {expected:>11,}")
    assert analytic == built == expected, name
one_gpsa, one_mhsa_no_bias = (sum(p.numel() for p in convit_ti.blocks[i].attn.parameters()) for i in (0, 11))
print(f"one GPSA layer of ConViT-Ti: {one_gpsa:,} parameters, one MHSA layer (no qkv bias): {one_mhsa_no_bias:,}")
assert (one_gpsa, one_mhsa_no_bias) == (147_668, 147_648) and one_gpsa - one_mhsa_no_bias == 5 * 4

# %% [markdown]
# ## Counting multiply-accumulates
#
# Table 1's "Flops" column fits multiply-accumulates (MACs) per 224×224 image without the attention matmuls (the
# paper does not state its convention). We count them layer by layer, for L tokens of width D (in the GPSA blocks
# L = 196 patches; after the class token joins, L = 197):
#
# * **linear layers**: the patch embedding (L·D·C·p²), per block 4·L·D² for the attention projections
#   (`qkv` + `proj`, or `qk` + `v` + `proj`), 2·L·D·4D for the MLP, the positional scores of a GPSA layer
#   (L²·3·N_h: `pos_proj` applied to `rel_indices`), and the head (D·K);
# * **LayerNorms**: we count 5 operations per element, the convention of the fvcore counter;
# * **attention matmuls**: Q·Kᵀ and A·V, 2·L²·D per layer (GPSA mixes its two attention maps into one matrix
#   before multiplying V, as the official code does; the fast path of chapter 07_operation_counts applies P to V apart,
#   as two factors, for L·(H + W)·D).

# %%
#| export
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
    linear, norm, attention = patches * d * c.in_chans * c.patch_size**2, 0, 0  # the patch embedding's
    for i in range(c.depth):
        positional = i < c.local_up_to_layer
        length = patches if positional else patches + c.num_prefix_tokens
        linear += 4 * length * d * d + 2 * length * d * hidden
        linear += length * length * 3 * c.num_heads if positional else 0
        attention += 2 * length * length * d
        norm += 2 * 5 * length * d
    norm += 5 * (patches + c.num_prefix_tokens) * d  # the final norm
    linear += d * c.num_classes * (1 + int(c.distilled))
    return MacCount(linear=linear, norm=norm, attention=attention)


# %% [markdown]
# ### Table 1, Size and Flops
#
# The paper prints "Flops" at a precision that varies ("4.3G", "17G"); ours must lie within half a unit of each
# printed value's last digit. Its Size column is looser (the released ConViT-S has 27.78 M parameters, printed "27M";
# the ConViT-Ti's 5.71 M are printed "6M"), so sizes get their relative difference; exact counts were checked above.

# %%
TABLE_1 = [  # (name, model, heads, embed_dim, size, flops) as printed in the paper
    ("Ti", "DeiT", 3, 192, "6M", "1G"), ("Ti", "ConViT", 4, 192, "6M", "1G"),
    ("Ti+", "DeiT", 4, 256, "10M", "2G"), ("Ti+", "ConViT", 4, 256, "10M", "2G"),
    ("S", "DeiT", 6, 384, "22M", "4.3G"), ("S", "ConViT", 9, 432, "27M", "5.4G"),
    ("S+", "DeiT", 9, 576, "48M", "10G"), ("S+", "ConViT", 9, 576, "48M", "10G"),
    ("B", "DeiT", 12, 768, "86M", "17G"), ("B", "ConViT", 16, 768, "86M", "17G"),
    ("B+", "DeiT", 16, 1024, "152M", "30G"), ("B+", "ConViT", 16, 1024, "152M", "30G")]
SIZES = {"Ti": "tiny", "Ti+": "tiny_plus", "S": "small", "S+": "small_plus", "B": "base", "B+": "base_plus"}


def matches_printed(value: float, printed: str) -> bool:
    """Does ``value`` round to the number printed in the paper, at the paper's precision?"""
    number = printed[:-1]
    half_unit = 0.5 * 10 ** -(len(number.split(".")[1]) if "." in number else 0)
    return abs(value - float(number)) <= half_unit + 1e-9


print("    model   Nh     D |  params paper   diff |  GMACs paper  +attn  linear")
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
    flops_differ += [(size, arch)] if flag else []
assert flops_differ == [("S+", "ConViT")] and max(abs(d) for d in size_diffs) < 0.05
# the numbers the prose states
m = {name: count_macs(cfg) for name, cfg in MODEL_ZOO.items()}
small, deit_small, tiny = m["convit_small"], m["deit_small"], m["convit_tiny"]
assert [round(x / 1e9, 2) for x in (small.total(False), small.total(), m["convit_small_plus"].total(False),
        m["deit_small_plus"].total(False), small.linear, deit_small.linear)] == [5.36, 5.76, 9.48, 9.51, 5.35, 4.24]
assert not matches_printed(small.linear / 1e9, "5.4G") and not matches_printed(deit_small.linear / 1e9, "4.3G")
assert round(100 * (1 - small.total(False) / small.total())) == 7  # the attention matmuls: about 7 % of the work
assert round((tiny.linear + tiny.norm) / tiny.attention) == 6  # ConViT-Ti's: about a sixth of the rest
fig, ax = plt.subplots(figsize=(5, 3), dpi=80)
for arch, style in (("ConViT", dict(s=90, facecolors="none", edgecolors="tab:blue")), ("DeiT", dict(s=12, c="k"))):
    names = [(size, f"{arch.lower()}_{SIZES[size]}") for size, a, *_ in TABLE_1 if a == arch]
    points = [(count_params(MODEL_ZOO[n]) / 1e6, m[n].total(False) / 1e9) for _, n in names]
    ax.scatter(*zip(*points), label=arch, **style)
    for (size, _), point in zip(names, points):
        ax.annotate(size, point, fontsize=7, xytext=(3, -8 if arch == "DeiT" else 3), textcoords="offset points")
ax.set(xscale="log", yscale="log", xlabel="parameters (M)", ylabel="GMACs per image", title="Table 1, at 224 px")
ax.legend(), plt.show()
ratio = {s: count_params(MODEL_ZOO[f"convit_{n}"]) / count_params(MODEL_ZOO[f"deit_{n}"]) for s, n in SIZES.items()}
assert {s for s, r in ratio.items() if abs(r - 1) > 0.02} == {"S"}, ratio  # each ConViT at its DeiT's size, but S

# %% [markdown]
# "GMACs" is our count without the attention matmuls, "+attn" with them, "linear" without the LayerNorms. Every Flops
# entry matches but one: ConViT-S+'s 9.48 GMACs are printed "10G", the value of its DeiT-S+ partner (9.51 G), which
# the ConViT undercuts a little because its GPSA layers' 196 patch tokens carry no class token. The LayerNorms matter
# for the rounding: the linear layers alone give 5.35 G and 4.24 G for ConViT-S and DeiT-S, which would print as 5.3G
# and 4.2G, so the paper's counter included them (the cell checks both). With the attention matmuls ConViT-S costs
# 5.76 GMACs, not 5.36: the column leaves out about 7% of the work at 224 px, and more at higher resolution
# (exercise 2). In the figure each ConViT sits at its DeiT's size but S (432 wide against 384).
#
# A profiler's FLOP counter sees less than this count on our layers; chapter 31 says why.

# %% [markdown]
# ## Exercises
#
# **1. The attention's cost, counted by you.** Write `attention_macs(config)`: the multiply-accumulates of the
# attention matmuls of one image through the model `config` describes — in each block, Q·Kᵀ and A·V over the tokens
# it attends over (L·L·D each, heads together; which blocks see the class token?), as `count_macs(...).attention`.

# %%
attention_macs = ...  # your answer: def attention_macs(config): ...

# %%
from convit_edu.checks import demonstrate, grade, reveal


def check_attention_macs(fn) -> None:
    for name in ("convit_tiny", "deit_tiny", "convit_small"):
        for side in (224, 160):
            cfg = model_config(name, img_size=side)
            got, want = fn(cfg), count_macs(cfg).attention
            check_answer(2 * got != want, f"{name} at {side} px: {got:,} is half the count: a block multiplies twice, "
                         "Q·Kᵀ (the scores) and A·V (the output)")
            check_answer(got * cfg.num_heads != want, f"{name} at {side} px: {got:,} is the count of one head: the "
                         "heads together have width D, so L·L·D per matmul for all of them")
            check_answer(got == want, f"{name} at {side} px: {got:,} where the count is {want:,}: a GPSA block attends "
                         "over the patches alone, an SA block over the patches and the class token (and DeiT's "
                         "blocks all see it)")


grade("attention_macs", attention_macs, check_attention_macs)
demonstrate(check_attention_macs, {
    "Q·Kᵀ alone": lambda c: count_macs(c).attention // 2,
    "one head's width": lambda c: count_macs(c).attention // c.num_heads,
    "every block with the class token": lambda c: c.depth * 2 * (c.num_patches + 1) ** 2 * c.embed_dim,
})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(attention_macs):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def attention_macs(config: ModelConfig) -> int:
        patches, total = config.num_patches, 0
        for block in range(config.depth):
            tokens = patches if block < config.local_up_to_layer else patches + config.num_prefix_tokens
            total += 2 * tokens * tokens * config.embed_dim  # Q·Kᵀ and A·V, all heads together
        return total

    grade("attention_macs", attention_macs, check_attention_macs)

# %% [markdown]
# **2. When attention dominates.** At 224 px ConViT-Ti's attention matmuls cost about a sixth of everything else;
# they grow with L², the rest with L. Estimate from one block (2·L²·D against 12·L·D²), then find exactly the smallest
# square side `crossover_side` (a multiple of 16 px) at which `count_macs`' attention exceeds `linear + norm`.

# %%
crossover_side = ...  # your answer: crossover_side = ...

# %%
def check_crossover_side(answer: int) -> None:
    def attention_wins(side: int) -> bool:
        macs = count_macs(model_config("convit_tiny"), side)
        return macs.attention > macs.linear + macs.norm

    check_answer(isinstance(answer, int) and answer >= 16 and answer % 16 == 0,
                 f"{answer!r} is not a side in pixels that the patch size 16 divides")
    check_answer(attention_wins(answer), f"at {answer} px the attention matmuls still cost less than the rest: go "
                 "higher (the estimate L ≈ 6·D leaves out the patch embedding, the norms and the positional scores)")
    check_answer(not attention_wins(answer - 16), f"at {answer - 16} px the attention matmuls already cost more: "
                 "go lower")


grade("crossover_side", crossover_side, check_crossover_side)
demonstrate(check_crossover_side, {"the estimate's side, not a multiple of 16": 543,
                                   "the estimate rounded up to a multiple of 16": 544, "a safe margin": 1024})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(crossover_side):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    # one block: 2·L²·D > 12·L·D² when L > 6·D = 1152 (≈ 543 px); norms and positional scores add to the rest
    crossover_side = next(side for side in range(16, 2048, 16)
                          if (c := count_macs(model_config("convit_tiny"), side)).attention > c.linear + c.norm)
    print(f"from {crossover_side} px ({(crossover_side // 16) ** 2} patches) on, attention takes most of "
          "ConViT-Ti's MACs")
    grade("crossover_side", crossover_side, check_crossover_side)
