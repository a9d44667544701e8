"""Gated positional self-attention (Eq. 6-7): the fast form equals the reference, the gate's ends, robustness."""

import contextlib
import math

import pytest
import torch
import torch.nn.functional as F
from gpsa_checks import grads, perturb, rel_err

from convit_edu.benchmarks import OperationCounter, count_operations
from convit_edu.conv_init import head_centres
from convit_edu.gpsa import GPSA, PSA, applies_factors, gpu_path
from convit_edu.gpsa_reference import GPSAReference
from convit_edu.positional import positional_self_attention, rel_indices


def pair(embed_dim=48, num_heads=4, dtype=torch.float32, seed=0, **kwargs):
    torch.manual_seed(seed)
    ref = GPSAReference(embed_dim, num_heads, **kwargs).to(dtype)
    fast = GPSA(embed_dim, num_heads, **kwargs).to(dtype)
    fast.load_state_dict(ref.state_dict())
    return ref, fast


GRIDS = [(4, 4), (3, 5), (5, 2)]
# the fast layer's two forms of P @ V: a CPU's (P's factors, by default here) and a GPU's (one product, `gpu_path`)
PATHS = {"factors": contextlib.nullcontext, "one product": gpu_path}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("perturbed", [False, True])
def test_fast_gpsa_matches_reference_outputs_and_gradients_fp32(grid, perturbed, path):
    ref, fast = pair()
    if perturbed:
        perturb(ref, gates=[-3.0, -0.5, 0.5, 3.0])
        fast.load_state_dict(ref.state_dict())
    x = torch.randn(3, grid[0] * grid[1], 48, requires_grad=True)
    y_ref, g_ref = grads(ref, x, grid)
    with PATHS[path]():
        y_fast, g_fast = grads(fast, x, grid)
    assert rel_err(y_fast, y_ref) <= 1e-5
    for name in g_ref:
        assert rel_err(g_fast[name], g_ref[name]) <= 1e-5, name


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("grid", GRIDS)
def test_fast_gpsa_matches_reference_in_fp64_to_1e_10(grid, path):
    ref, fast = pair(dtype=torch.float64)
    perturb(ref, scale=0.2, gates=[-2.0, 0.0, 1.0, 4.0])
    fast.load_state_dict(ref.state_dict())
    x = torch.randn(2, grid[0] * grid[1], 48, dtype=torch.float64, requires_grad=True)
    y_ref, g_ref = grads(ref, x, grid)
    with PATHS[path]():
        y_fast, g_fast = grads(fast, x, grid)
    assert rel_err(y_fast, y_ref) <= 1e-10
    for name in g_ref:
        assert rel_err(g_fast[name], g_ref[name]) <= 1e-10, name


@pytest.mark.parametrize("path", ["gate_override", "return_attention", "attention_dropout"])
def test_the_other_paths_of_the_fast_gpsa_match_the_reference_in_fp64_to_1e_10(path):
    ref, fast = pair(dtype=torch.float64, attn_drop=0.3 if path == "attention_dropout" else 0.0)
    perturb(ref, scale=0.2, gates=[-2.0, 0.0, 1.0, 4.0])
    fast.load_state_dict(ref.state_dict())
    if path == "gate_override":
        ref.gate_override = fast.gate_override = 0.3
    if path != "attention_dropout":
        ref.eval(), fast.eval()
    x = torch.randn(2, 15, 48, dtype=torch.float64, requires_grad=True)
    outputs = []
    for layer in (ref, fast):
        torch.manual_seed(1)  # the same dropout mask for both
        y = layer(x, (3, 5), return_attention=path == "return_attention")
        y, attn = y if isinstance(y, tuple) else (y, None)
        outputs.append((y, attn, torch.autograd.grad(y.square().sum(), [x, *layer.parameters()], allow_unused=True)))
    (y_ref, a_ref, g_ref), (y_fast, a_fast, g_fast) = outputs
    assert rel_err(y_fast, y_ref) <= 1e-10
    assert a_ref is None or rel_err(a_fast, a_ref) <= 1e-10
    for name, got, want in zip(["x", *dict(ref.named_parameters())], g_fast, g_ref):
        if name == "gating_param" and path == "gate_override":
            assert got is None and want is None  # the override replaces the gates
        elif name != "pos_proj.bias":  # zero in exact arithmetic (gpsa_checks.grads)
            assert rel_err(got, want) <= 1e-10, name


@pytest.mark.parametrize("path", PATHS)
def test_fast_gpsa_matches_reference_under_bf16_autocast(path):
    ref, fast = pair()
    x = torch.randn(2, 16, 48)
    with torch.autocast("cpu", dtype=torch.bfloat16), PATHS[path]():
        y_ref, y_fast = ref(x), fast(x)
    assert y_fast.dtype == torch.bfloat16
    assert rel_err(y_fast.float(), y_ref.float()) <= 3e-2
    assert rel_err(y_fast.float(), fast(x)) <= 3e-2  # and close to fp32


def test_gate_one_is_pure_positional_attention():
    ref, fast = pair()
    x = torch.randn(2, 15, 48)
    q, k, v = fast._projections(x)
    pos = fast.positional_scores((3, 5)).softmax(-1)
    for layer in (ref, fast):
        layer.gate_override = 1.0
        torch.testing.assert_close(layer(x, (3, 5)), layer._output(pos @ v), rtol=1e-5, atol=1e-6)


def test_gate_zero_is_pure_content_attention():
    ref, fast = pair()
    x = torch.randn(2, 15, 48)
    q, k, v = fast._projections(x)
    content = (q @ k.transpose(-2, -1) / math.sqrt(12)).softmax(-1)
    for layer in (ref, fast):
        layer.gate_override = 0.0
        torch.testing.assert_close(layer(x, (3, 5)), layer._output(content @ v), rtol=1e-5, atol=1e-6)


def test_learned_gates_saturating_reach_the_pure_forms():
    _, fast = pair()
    x = torch.randn(1, 16, 48)
    with torch.no_grad():
        fast.gating_param.fill_(400.0)  # sigma = 1 to float precision (and e^400 is no fp32 number)
    fast_pos = fast(x)
    fast.gate_override = 1.0
    torch.testing.assert_close(fast_pos, fast(x))


def test_gating_starts_at_one_and_local_init_centres_each_head():
    layer = GPSA(54, 9, locality_strength=2.0)
    assert torch.equal(layer.gating_param, torch.ones(9))
    torch.testing.assert_close(layer.v.weight, torch.eye(54))
    attn = layer.positional_scores((7, 7)).softmax(-1)  # (heads, L, L)
    query = 3 * 7 + 3
    for h, (dx, dy) in enumerate(head_centres(9).tolist()):
        peak = int(attn[h, query].argmax())
        assert (peak // 7 - 3, peak % 7 - 3) == (dy, dx)


def test_returned_attention_rows_sum_to_one_and_match_between_implementations():
    ref, fast = pair()
    x = torch.randn(2, 12, 48)
    y_ref, a_ref = ref(x, (3, 4), return_attention=True)
    y_fast, a_fast = fast(x, (3, 4), return_attention=True)
    assert a_ref.shape == (2, 4, 12, 12)
    torch.testing.assert_close(a_ref.sum(-1), torch.ones(2, 4, 12))
    torch.testing.assert_close(a_fast, a_ref)
    torch.testing.assert_close(y_fast, fast(x, (3, 4)), rtol=1e-5, atol=1e-6)


def test_attention_dropout_in_training_uses_the_materialized_form():
    torch.manual_seed(0)
    layer = GPSA(48, 4, attn_drop=0.5).train()
    x = torch.randn(2, 16, 48)
    torch.manual_seed(1)
    y1 = layer(x)
    torch.manual_seed(1)
    y2 = layer(x)
    torch.testing.assert_close(y1, y2)  # same mask from the same seed
    assert not torch.allclose(y1, layer.eval()(x))  # dropout acted


def test_psa_is_eq4_one_softmax_over_summed_scores():
    torch.manual_seed(0)
    layer = PSA(48, 4)
    perturb(layer)
    x = torch.randn(2, 15, 48)
    q, k, v = layer._projections(x)
    # Eq. 4 without pos_proj.bias: a per-head shift of every score, which the softmax does not see
    expected, _ = positional_self_attention(q, k, v, rel_indices(3, 5), layer.pos_proj.weight)
    expected = layer._output(expected)
    torch.testing.assert_close(layer(x, (3, 5)), expected, rtol=1e-5, atol=1e-5)
    y, attn = layer(x, (3, 5), return_attention=True)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    assert "gating_param" not in layer.state_dict()
    assert set(layer.state_dict()) == set(GPSA(48, 4).state_dict()) - {"gating_param"}


def test_rel_indices_is_not_saved_and_is_rebuilt_for_each_grid():
    ref, fast = pair()
    assert set(fast.state_dict()) == {
        "qk.weight", "v.weight", "proj.weight", "proj.bias", "pos_proj.weight", "pos_proj.bias", "gating_param"
    }
    for layer in (ref, fast):
        with gpu_path():  # the fast layer's path that reads rel_indices (a CPU's factors need none)
            layer(torch.randn(1, 84, 48), (7, 12))
            a = layer.rel_indices.clone()
            layer(torch.randn(1, 84, 48), (12, 7))
        assert not torch.equal(a, layer.rel_indices)  # same L, other grid: rebuilt
        torch.testing.assert_close(layer.rel_indices, rel_indices(12, 7))


@pytest.mark.parametrize("cls", [GPSA, GPSAReference, PSA])
def test_a_layer_told_its_grid_builds_rel_indices_at_construction(cls):
    layer = cls(48, 4, grid_size=(3, 5))
    torch.testing.assert_close(layer.rel_indices, rel_indices(3, 5), rtol=0, atol=0)
    assert "rel_indices" not in layer.state_dict()
    assert cls(48, 4).rel_indices is None  # no grid given: built at the first forward
    with gpu_path():  # GPSA's path that reads rel_indices (a CPU's factors need none)
        layer(torch.randn(1, 15, 48), (5, 3))  # another grid: rebuilt
    torch.testing.assert_close(layer.rel_indices, rel_indices(5, 3), rtol=0, atol=0)
    layer.double()  # moves with the layer
    assert layer.rel_indices.dtype == torch.float64
    with pytest.raises(ValueError, match="width"):
        cls(48, 4, grid_size=(3, 0))


def test_layer_moved_to_another_dtype_after_a_forward_still_works():
    ref, fast = pair()
    x = torch.randn(2, 16, 48)
    fast(x)
    fast.double()
    y = fast(x.double())
    assert y.dtype == torch.float64 and fast(x.double(), return_attention=True)[1].dtype == torch.float64
    torch.testing.assert_close(y.float(), ref(x), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_layer_moved_to_cuda_after_a_forward_still_works():
    ref, fast = pair()
    x = torch.randn(2, 16, 48)
    expected = fast(x)
    fast.cuda()
    torch.testing.assert_close(fast(x.cuda()).cpu(), expected, rtol=1e-4, atol=1e-5)


def test_a_gpsa_layer_of_convit_ti_has_147668_parameters():
    assert sum(p.numel() for p in GPSA(192, 4).parameters()) == 147_668


@pytest.mark.parametrize("cls", [GPSA, GPSAReference, PSA])
def test_bad_input_is_refused_with_the_value_named(cls):
    with pytest.raises(ValueError, match="embed_dim 50 is not divisible by num_heads 4"):
        cls(50, 4)
    with pytest.raises(ValueError, match="locality_strength"):
        cls(48, 4, locality_strength=0.0)
    layer = cls(48, 4)
    with pytest.raises(ValueError, match="sequence length 17 is not a square"):
        layer(torch.randn(1, 17, 48))
    with pytest.raises(ValueError, match=r"sequence length 16 does not match grid_size \(3, 5\)"):
        layer(torch.randn(1, 16, 48), grid_size=(3, 5))
    with pytest.raises(ValueError, match="embed_dim=48"):
        layer(torch.randn(1, 16, 40))


@pytest.mark.parametrize("path", PATHS)
def test_fast_gpsa_builds_no_batch_sized_attention_tensor(path):
    """The positional attention is computed once per forward and applied to the whole batch: nothing of size
    B x heads x L x L is saved; P (heads, L, L) once on a GPU's path, its factors (heads, 6, 6) on a CPU's."""
    _, fast = pair()
    x = torch.randn(8, 36, 48, requires_grad=True)
    shapes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
        with PATHS[path]():
            fast(x, (6, 6))
    assert not any(len(s) == 4 and s[-2:] == (36, 36) for s in shapes), shapes
    assert ((4, 36, 36) in shapes) == (path == "one product") and ((4, 6, 6) in shapes) == (path == "factors")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("grid", GRIDS + [(7, 12)])
def test_the_positional_softmax_is_the_kronecker_product_of_a_column_and_a_row(grid, dtype):
    """Chapter 07_operation_counts' factorisation: P of an H x W grid is P of its one-column grid (H x 1) times P of
    its one-row grid (1 x W), Kronecker-wise."""
    ref, _ = pair(dtype=dtype)
    perturb(ref, scale=0.3)
    py, px = ref.positional_softmax((grid[0], 1)), ref.positional_softmax((1, grid[1]))
    assert py.shape == (4, grid[0], grid[0]) and px.shape == (4, grid[1], grid[1]) and py.dtype == dtype
    kron = torch.einsum("hik,hjl->hijkl", py, px).reshape(4, grid[0] * grid[1], -1)
    assert rel_err(kron, ref.positional_softmax(grid)) <= (1e-6 if dtype == torch.float32 else 1e-13)


@pytest.mark.parametrize("precision, override", [(None, None), (torch.bfloat16, None), (torch.float16, None),
                                                 (None, 0.3)])
def test_fast_gpsa_is_one_sdpa_one_product_with_p_and_one_lerp_in_every_precision(precision, override):
    _, fast = pair()
    fast.gate_override = override
    x = torch.randn(2, 16, 48)
    with torch.autocast("cpu", dtype=precision or torch.bfloat16, enabled=precision is not None):
        ops = count_operations(lambda: fast(x)).counts
    sdpa = ops["forward", "_scaled_dot_product_flash_attention_for_cpu.default"]
    assert ops["forward", "bmm.default"] == ops["forward", "lerp.Tensor"] == sdpa == 1


def test_on_a_cpu_p_is_applied_as_its_factors_and_counted_as_the_gpus_one_product():
    """Two products along the grid's axes where a CPU runs the layer; one with P where the operation counts, the
    proxy of a GPU's launches, count it; a GPU (the meta device stands in) takes the one product."""
    _, fast = pair()
    x = torch.randn(2, 15, 48)
    with OperationCounter() as on_a_cpu:
        fast(x, (3, 5))
    assert on_a_cpu.counts["forward", "bmm.default"] == 2
    assert count_operations(lambda: fast(x, (3, 5))).counts["forward", "bmm.default"] == 1
    assert applies_factors(torch.device("cpu")) and not applies_factors(torch.device("meta"))
    with gpu_path():
        assert not applies_factors(torch.device("cpu"))
    assert applies_factors(torch.device("cpu"))  # restored on leaving


def test_the_denormal_flush_runs_on_a_cpu_only(monkeypatch):
    """A GPU computes with denormal numbers at full speed: for scores elsewhere than on a CPU (here on the meta device,
    standing in for a GPU) P is the plain softmax, without the flush's hardshrink."""
    layer = GPSAReference(48, 4)
    names = {}
    for device in ("cpu", "meta"):
        scores = torch.randn(4, 15, 15, device=device)
        monkeypatch.setattr(layer, "positional_scores", lambda grid_size: scores)
        names[device] = {name for _, name in count_operations(lambda: layer.positional_softmax((3, 5))).counts}
    assert names == {"cpu": {"_softmax.default", "hardshrink.default"}, "meta": {"_softmax.default"}}


def test_every_parameter_of_the_fast_layer_gets_a_gradient():
    """DDP (find_unused_parameters=False) expects every parameter used, pos_proj.bias included."""
    _, fast = pair()
    fast(torch.randn(2, 16, 48)).square().sum().backward()
    assert all(p.grad is not None for p in fast.parameters())


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("gates", [[-12.0, -6.0, 6.0, 12.0], [-200.0, -60.0, 60.0, 200.0]])
def test_gates_far_from_zero_stay_exact_in_fp32_and_finite_in_fp16(gates, path):
    ref, fast = pair()
    perturb(ref, gates=gates)
    fast.load_state_dict(ref.state_dict())
    x = torch.randn(2, 15, 48)
    with torch.no_grad(), PATHS[path]():
        want = ref(x, (3, 5))
        assert rel_err(fast(x, (3, 5)), want) <= 1e-5
        with torch.autocast("cpu", dtype=torch.float16):
            y16 = fast(x, (3, 5))
    assert torch.isfinite(y16).all() and rel_err(y16.float(), want) <= 3e-3


def test_fast_gpsa_content_term_goes_through_sdpa(monkeypatch):
    calls = []
    real = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or real(*a, **k))
    _, fast = pair()
    fast(torch.randn(2, 16, 48))
    assert calls == [1]


def test_positional_softmax_sets_denormals_to_zero_and_keeps_every_other_entry():
    torch.manual_seed(0)
    layer = GPSAReference(48, 4)  # α = 1: far keys of a 14 x 14 grid get probabilities below 1e-38
    with torch.no_grad():
        raw = layer.positional_scores((14, 14)).softmax(dim=-1)
        flushed = layer.positional_softmax((14, 14))
    tiny = torch.finfo(torch.float32).tiny
    denormal = (raw > 0) & (raw < tiny)
    assert denormal.any()
    assert not ((flushed > 0) & (flushed < tiny)).any()
    assert torch.equal(flushed[~denormal], raw[~denormal]) and (flushed[denormal] == 0).all()


class DenormalInputs(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts, per operation, the denormal fp32 numbers that enter it (every op of forward, backward, optimiser)."""

    def __init__(self):
        super().__init__()
        self.counts: dict[str, int] = {}

    OVERWRITING = {"fill_.Scalar", "zero_.default"}  # they read no value (memory from torch.empty holds any bits)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tiny = torch.finfo(torch.float32).tiny
        for t in [] if func.__name__ in self.OVERWRITING else torch.utils._pytree.tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.numel():
                n = int(((t != 0) & (t.abs() < tiny)).sum())
                if n:
                    self.counts[func.__name__] = self.counts.get(func.__name__, 0) + n
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("path", PATHS)
def test_a_convit_training_step_multiplies_no_denormal_number_by_a_batch(path):
    from convit_edu.zoo import create_model

    torch.manual_seed(0)
    model = create_model("convit_tiny", img_size=224, num_classes=10, depth=2, local_up_to_layer=1)
    optimizer = torch.optim.AdamW(model.parameters())
    x, y = torch.randn(2, 3, 224, 224), torch.randint(0, 10, (2,))
    with PATHS[path](), DenormalInputs() as seen:
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
    # on a 14 x 14 grid far keys get probabilities below 1e-38: they may enter only the flush itself, forward and
    # backward, elementwise on (heads, L, L) tensors, or on a CPU's (heads, 14, 14) factors (after the softmax, after
    # the gate scales P^y, and after their backward)
    assert seen.counts, "no denormal made at all: the check would see nothing"
    assert set(seen.counts) <= {"hardshrink.default", "hardshrink_backward.default"}, seen.counts
