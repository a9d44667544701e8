"""Claims of chapter 01 (nbs/01_self_attention.py) about convit_edu.attention.MHSA."""

import contextlib
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from convit_edu.attention import MHSA, fused_attention
from convit_edu.gpsa import GPSA, PSA


def make(embed_dim: int = 24, num_heads: int = 4, seed: int = 0, **kwargs) -> MHSA:
    torch.manual_seed(seed)
    m = MHSA(embed_dim, num_heads, **kwargs).eval()
    with torch.no_grad():  # nn.Linear biases start near 0; make them matter
        for p in m.parameters():
            if p.ndim == 1:
                p.normal_()
    return m


def reference_mhsa(m: MHSA, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 1-3 head by head, with per-head weight blocks cut out of qkv, in plain loops."""
    D, Dh = m.embed_dim, m.head_dim
    w = m.qkv.weight
    b = m.qkv.bias if m.qkv.bias is not None else torch.zeros(3 * D)
    outs, maps = [], []
    for h in range(m.num_heads):
        rows = [slice(part * D + h * Dh, part * D + (h + 1) * Dh) for part in range(3)]
        q, k, v = (x @ w[r].T + b[r] for r in rows)
        a = torch.softmax(q @ k.transpose(-2, -1) / Dh**0.5, dim=-1)
        outs.append(a @ v)
        maps.append(a)
    return m.proj(torch.cat(outs, dim=-1)), torch.stack(maps, dim=1)


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_mhsa_computes_eq_1_to_3_head_by_head(qkv_bias):
    m = make(qkv_bias=qkv_bias)
    x = torch.randn(3, 7, 24)
    y_ref, a_ref = reference_mhsa(m, x)
    y, attn = m(x, return_attention=True)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(attn, a_ref)
    torch.testing.assert_close(m(x), y_ref)


@contextlib.contextmanager
def sdpa_calls():
    """What every call of ``F.scaled_dot_product_attention`` computes in: (its queries' dtype, whether the CPU's
    autocast was on, which would cast them to bf16 again)."""
    calls, original = [], F.scaled_dot_product_attention

    def spy(q, *args, **kwargs):
        calls.append((q.dtype, torch.is_autocast_enabled("cpu")))
        return original(q, *args, **kwargs)

    F.scaled_dot_product_attention = spy
    try:
        yield calls
    finally:
        F.scaled_dot_product_attention = original


def test_fast_path_uses_sdpa_and_equals_materialised_attention():
    m = make()
    x = torch.randn(2, 10, 24)
    with sdpa_calls() as calls:
        y_fast = m(x)
        y_slow, _ = m(x, return_attention=True)
    assert len(calls) == 1, "SDPA must run on the fast path only"
    torch.testing.assert_close(y_fast, y_slow)


@pytest.mark.parametrize("layer", [MHSA(48, 4), GPSA(48, 4), PSA(48, 4)], ids=["MHSA", "GPSA", "PSA"])
def test_every_attention_layer_attends_in_fp32_under_cpu_bf16_autocast(layer):
    """Chapter 20: the CPU's bf16 SDPA kernel took 2-7 times as long as its fp32 one, so bf16 attends in fp32."""
    x = torch.randn(2, 16, 48, requires_grad=True)
    with sdpa_calls() as calls, torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer.train()(x)
    assert calls == [(torch.float32, False)] and y.dtype == torch.bfloat16  # the rest of the layer stays in bf16
    y.float().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()
    with sdpa_calls() as calls:
        layer(x)
    assert calls == [(torch.float32, False)]


def test_fused_attention_is_sdpa_in_fp32_on_a_cpu_and_sdpa_itself_elsewhere():
    q, k, v = torch.randn(3, 2, 4, 9, 8).unbind(0)
    mask = torch.randn(4, 9, 9)
    low = [t.bfloat16() for t in (q, k, v, mask)]
    want = F.scaled_dot_product_attention(*(t.float() for t in low[:3]), attn_mask=low[3].float())
    with sdpa_calls() as calls:
        got = fused_attention(*low[:3], attn_mask=low[3])
    assert calls == [(torch.float32, False)] and got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want.bfloat16(), rtol=0, atol=0)
    torch.testing.assert_close(fused_attention(q, k, v, attn_mask=mask),
                               F.scaled_dot_product_attention(q, k, v, attn_mask=mask), rtol=0, atol=0)
    with sdpa_calls() as calls:  # a GPU's kernel is left to torch (a meta tensor stands in for one here)
        fused_attention(*(t.to("meta") for t in low[:3]))
    assert calls == [(torch.bfloat16, False)]


def test_mhsa_equals_nn_multihead_attention_with_copied_weights():
    m = make(qkv_bias=True)
    ref = nn.MultiheadAttention(24, 4, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(m.qkv.weight)
        ref.in_proj_bias.copy_(m.qkv.bias)
        ref.out_proj.weight.copy_(m.proj.weight)
        ref.out_proj.bias.copy_(m.proj.bias)
    x = torch.randn(2, 9, 24)
    y_ref, a_ref = ref(x, x, x, need_weights=True, average_attn_weights=False)
    y, attn = m(x, return_attention=True)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(attn, a_ref)


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_mhsa_loads_timm_attention_weights_and_matches_it(qkv_bias):
    timm_vit = pytest.importorskip("timm.models.vision_transformer")
    torch.manual_seed(1)
    ref = timm_vit.Attention(48, num_heads=4, qkv_bias=qkv_bias).eval()
    m = MHSA(48, 4, qkv_bias=qkv_bias).eval()
    m.load_state_dict(ref.state_dict())
    x = torch.randn(2, 17, 48)
    torch.testing.assert_close(m(x), ref(x))


def test_attention_rows_are_distributions():
    _, attn = make()(torch.randn(2, 11, 24) * 5, return_attention=True)
    assert attn.shape == (2, 4, 11, 11)
    assert (attn >= 0).all()
    torch.testing.assert_close(attn.sum(-1), torch.ones(2, 4, 11))


def test_mhsa_is_permutation_equivariant():
    m = make()
    x = torch.randn(2, 13, 24)
    perm = torch.randperm(13, generator=torch.Generator().manual_seed(3))
    y, attn = m(x, return_attention=True)
    y_p, attn_p = m(x[:, perm], return_attention=True)
    torch.testing.assert_close(y_p, y[:, perm])
    torch.testing.assert_close(attn_p, attn[:, :, perm][:, :, :, perm])


def test_structure_names_and_parameter_count():
    m = MHSA(192, 4)
    assert m.head_dim == 48 and m.embed_dim == 192 and m.num_heads == 4
    assert (m.qkv.in_features, m.qkv.out_features, m.qkv.bias) == (192, 576, None)
    assert (m.proj.in_features, m.proj.out_features) == (192, 192) and m.proj.bias is not None
    assert set(m.state_dict()) == {"qkv.weight", "proj.weight", "proj.bias"}
    assert sum(p.numel() for p in m.parameters()) == 147_648  # 4·D² + D for D = 192: qkv without bias, proj with
    assert set(MHSA(192, 3, qkv_bias=True).state_dict()) == {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"}


@pytest.mark.parametrize("return_attention", [False, True])
def test_attention_dropout_is_random_in_training_unbiased_and_off_in_eval(return_attention):
    torch.manual_seed(0)
    m = MHSA(8, 2, attn_drop=0.5)
    x = torch.randn(1, 4, 8)
    m.eval()
    y_eval = m(x, return_attention=return_attention)
    y_eval = y_eval[0] if return_attention else y_eval
    y_eval_again = m(x, return_attention=return_attention)
    torch.testing.assert_close(y_eval_again[0] if return_attention else y_eval_again, y_eval)
    m.train()
    out = m(x.expand(4000, -1, -1), return_attention=return_attention)
    y_train = out[0] if return_attention else out
    assert not torch.allclose(y_train[0], y_train[1])
    torch.testing.assert_close(y_train.mean(0, keepdim=True), y_eval, atol=0.02, rtol=0)
    if return_attention:  # the returned map is the softmax of Eq. 1, before dropout
        torch.testing.assert_close(out[1].sum(-1), torch.ones(4000, 2, 4))


def test_proj_dropout_acts_only_in_training():
    torch.manual_seed(0)
    m = MHSA(16, 2, proj_drop=0.5)
    x = torch.randn(2, 5, 16)
    y_eval = m.eval()(x)
    y_train = m.train()(x)
    zeroed = y_train == 0
    assert zeroed.any() and not (y_eval == 0).any()
    torch.testing.assert_close(y_train[~zeroed], 2 * y_eval[~zeroed])


def test_gradients_reach_every_parameter_on_both_paths():
    for return_attention in (False, True):
        m = MHSA(16, 4, qkv_bias=True)
        out = m(torch.randn(2, 5, 16), return_attention=return_attention)
        (out[0] if return_attention else out).square().sum().backward()
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters())


@pytest.mark.parametrize(
    "embed_dim, num_heads, match",
    [(100, 3, "embed_dim 100 is not divisible by num_heads 3"), (192, 0, "num_heads must be at least 1, got 0"),
     (0, 3, "embed_dim 0 is not divisible")],
)
def test_bad_constructor_arguments_name_the_value(embed_dim, num_heads, match):
    with pytest.raises(ValueError, match=match):
        MHSA(embed_dim, num_heads)


@pytest.mark.parametrize("shape", [(197, 192), (2, 3, 197, 192), (2, 197, 96)])
def test_bad_input_shape_is_named_before_any_work(shape):
    m = MHSA(192, 3)
    calls = []
    m.qkv.register_forward_hook(lambda *args: calls.append(1))
    with pytest.raises(ValueError, match=re.escape(f"embed_dim=192), got {tuple(shape)}")):
        m(torch.zeros(shape))
    assert not calls
