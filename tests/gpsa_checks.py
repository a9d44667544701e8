"""Helpers that the GPSA tests and the benchmark's tests of the official form share."""

import torch


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach() - b.detach()).norm() / b.detach().norm())


def perturb(layer, scale=0.05, gates=None):
    with torch.no_grad():
        for p in layer.parameters():
            p.add_(torch.randn_like(p) * scale)
        if gates is not None:
            layer.gating_param.copy_(torch.tensor(gates, dtype=layer.gating_param.dtype))


def grads(layer, x, grid):
    y = layer(x, grid_size=grid)
    names = ["x", *dict(layer.named_parameters())]
    g = torch.autograd.grad((y * torch.linspace(-1, 1, y.shape[-1], dtype=y.dtype)).square().sum(),
                            [x, *layer.parameters()])
    out = dict(zip(names, g))
    out.pop("pos_proj.bias")  # zero in exact arithmetic: a per-head shift of all scores leaves softmax unchanged
    return y, out
