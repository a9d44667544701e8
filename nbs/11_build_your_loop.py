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
# # Your loop: DeiT's schedule, gradient clipping, an epoch
#
# Chapters 01-10 built the ConViT and its DeiT twin and checked them at initialisation. To watch them learn they need a
# training loop. The package has one, `fit`, a loop of a few dozen lines that the next chapter (`11_fit`) shows and
# runs on photographs; first you write it yourself: the schedule that sets its rate at every step, then a line `fit`
# leaves out, gradient clipping, which the production loop has, and last the epoch itself, which must give the same
# losses and the same weights as `fit`'s. Each check compares your code with the package's, imported inside the check
# as a reference (`convit_edu.schedule.deit_lr`, `convit_edu.teaching_loop.fit`; chapter 11_fit shows them, after
# you have written yours). The checks run on small models and random images, in seconds.

# %% tags=["parameters"]
import os

FAST = os.environ.get("CONVIT_EDU_FAST", os.environ.get("CI", "")).strip().lower() in ("1", "true", "yes", "on")

# %%
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from convit_edu.zoo import create_model

torch.set_printoptions(precision=4, sci_mode=False)
torch.set_num_threads(1)  # models this small gain little from a second core, and lose much when it is busy
_ = torch.manual_seed(0)

# %% [markdown]
# The checks of clipping and of the epoch train small zoo models (chapter 10), the kind chapter 11_fit trains, shrunk
# further so that a check takes a moment: 32-pixel images in 8-pixel patches (4 × 4 tokens), width 48 in 4 heads,
# 2 blocks, 10 classes; the ConViT's first block is GPSA.

# %%
SMALL = dict(img_size=32, patch_size=8, embed_dim=48, num_heads=4, depth=2, num_classes=10)


def small_model(name: str, seed: int = 0) -> nn.Module:
    """A small zoo model ("convit_tiny" or "deit_tiny" shrunk to `SMALL`), initialized from `seed`."""
    _ = torch.manual_seed(seed)
    return create_model(name, **SMALL, **({"local_up_to_layer": 1} if name.startswith("convit") else {}))


assert small_model("deit_tiny")(torch.randn(2, 3, 32, 32)).shape == (2, 10)
assert all(torch.equal(a, b) for a, b in zip(small_model("convit_tiny").parameters(),
                                             small_model("convit_tiny").parameters()))  # one seed, one model
print(f"a small ConViT: {sum(p.numel() for p in small_model('convit_tiny').parameters()):,} parameters, "
      f"a small DeiT: {sum(p.numel() for p in small_model('deit_tiny').parameters()):,}")

# %% [markdown]
# ## Exercises
#
# How they work (chapter 00_input_checks): replace the placeholder `...` in the answer cell, then run the check below
# it. What you write here stays in this notebook: chapter 11_fit trains with the package's `fit`, and from chapter 32
# on the core path trains with the package's production loop, `convit_edu.training.train` (`fit`, hardened in the
# engineering track), not with your `my_epoch`.
#
# **1. DeiT's schedule, yours.** The paper trains with DeiT's recipe (Sec. 3; Touvron et al. 2020), whose learning
# rate η is set before every optimiser step t (0, 1, …, T − 1): a linear warm-up from `warmup_lr` to the peak over the
# first t_w steps, then half a cosine period down to `min_lr` at step T,
#
# $$\eta(t) = \eta_\text{warmup} + (\eta_\text{peak} - \eta_\text{warmup})\,\frac{t}{t_w} \quad (t < t_w), \qquad
# \eta(t) = \eta_\min + \tfrac12(\eta_\text{peak}-\eta_\min)\Bigl(1+\cos\pi\,\tfrac{t-t_w}{T-t_w}\Bigr)
# \quad (t_w \le t \le T),$$
#
# and `min_lr` after step T. Write `my_lr(step, total_steps, warmup_steps, peak_lr, min_lr, warmup_lr)`: η at
# optimiser step `step`, with T = `total_steps` and t_w = `warmup_steps`. The check compares it, step by step, with
# the package's `deit_lr`.

# %%
my_lr = ...  # your answer: def my_lr(step, total_steps, warmup_steps, peak_lr, min_lr, warmup_lr): ...

# %%
from convit_edu.checks import check_answer, demonstrate, grade, reveal


def check_my_lr(fn) -> None:
    from convit_edu.schedule import deit_lr  # the package's schedule (chapter 11_fit): the reference

    for total, warmup in ((100, 10), (312, 78)):
        schedule = (total, warmup, 1e-3, 1e-5, 1e-6)
        rates = {step: (fn(step, *schedule), deit_lr(step, *schedule)) for step in range(total + 20)}
        wrong = [step for step, (got, want) in rates.items()
                 if not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12)]
        check_answer(0 not in wrong, f"step 0 runs at {rates[0][0]:.3g}: the warm-up starts from warmup_lr, not 0")
        check_answer(not [s for s in wrong if s < warmup], "the warm-up is a straight line from warmup_lr at step 0 "
                     "that would reach peak_lr at step warmup_steps, where the cosine takes over")
        check_answer(total not in wrong, f"step {total} = total_steps runs at {rates[total][0]:.3g}: the cosine "
                     "reaches min_lr there")
        check_answer(not [s for s in wrong if s < total], "after the warm-up: min_lr + ½(peak_lr − min_lr)(1 + cos π·p), "
                     "p running from 0 at warmup_steps to 1 at total_steps (half a period)")
        check_answer(not wrong, f"step {wrong[0] if wrong else 0} is after total_steps: the rate stays at min_lr there")


def slip_lr(start_at_zero: bool = False, early_peak: bool = False, floor: bool = True, linear: bool = False,
            clamp: bool = True):
    """DeiT's schedule with the slips asked for: the wrong answers the check is shown on."""
    def lr(step, total_steps, warmup_steps, peak_lr, min_lr, warmup_lr):
        start, end = (0.0 if start_at_zero else warmup_lr), (min_lr if floor else 0.0)
        if step < warmup_steps:
            return start + (peak_lr - start) * step / (warmup_steps - 1 if early_peak else warmup_steps)
        progress = (step - warmup_steps) / (total_steps - warmup_steps)
        progress = min(1.0, progress) if clamp else progress
        if linear:
            return peak_lr - (peak_lr - end) * progress
        return end + 0.5 * (peak_lr - end) * (1 + math.cos(math.pi * progress))
    return lr


grade("my_lr", my_lr, check_my_lr)
demonstrate(check_my_lr, {"the warm-up from 0": slip_lr(start_at_zero=True),
                          "the peak one step early": slip_lr(early_peak=True),
                          "the cosine down to 0": slip_lr(floor=False), "a straight line down": slip_lr(linear=True),
                          "no floor after total_steps": slip_lr(clamp=False)})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(my_lr):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def my_lr(step: int, total_steps: int, warmup_steps: int, peak_lr: float, min_lr: float, warmup_lr: float) -> float:
        if step < warmup_steps:
            return warmup_lr + (peak_lr - warmup_lr) * step / warmup_steps
        progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
        return min_lr + 0.5 * (peak_lr - min_lr) * (1 + math.cos(math.pi * progress))

    grade("my_lr", my_lr, check_my_lr)

# %% [markdown]
# **2. Gradient clipping.** A long run may meet a batch with a huge gradient, and one step along it can undo many
# epochs. Clipping rescales *all* gradients together so that their joint 2-norm ‖g‖ (over every element of every
# parameter) is at most `max_norm`. Write `clip_gradients(model, max_norm)`: it multiplies every
# gradient by `max_norm / ‖g‖` when ‖g‖ > `max_norm` and returns ‖g‖ before clipping (`fit` would call it between
# `loss.backward()` and `optimizer.step()`).

# %%
clip_gradients = ...  # your answer: def clip_gradients(model, max_norm): ...

# %%
def check_clip_gradients(fn) -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 3, 32, 32, generator=g), torch.randint(0, 10, (8,), generator=g)
    for max_norm in (1.0, 1e6):  # the gradients' norm is far above the first, far below the second
        mine, ref = small_model("deit_tiny"), small_model("deit_tiny")
        for m in (mine, ref):
            F.cross_entropy(m(x) * 100, y).backward()  # large logits, large gradients
        norm = fn(mine, max_norm)
        before = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm))  # it returns the norm before
        check_answer(isinstance(norm, (float, int, torch.Tensor)), f"return ‖g‖ before clipping, a number, got {norm!r}")
        norm = float(norm)
        check_answer(before < max_norm or not math.isclose(norm, max_norm, rel_tol=1e-4), "you return the norm after "
                     "clipping, max_norm itself: return ‖g‖ as it was before")
        check_answer(math.isclose(norm, before, rel_tol=1e-4), "return the joint norm of every gradient, before clipping")
        close = all(torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-8) for a, b in zip(mine.parameters(), ref.parameters()))
        if before < max_norm:
            check_answer(close, f"‖g‖ is below max_norm = {max_norm:g} here: leave the gradients as they "
                         "are (clip only when ‖g‖ > max_norm)")
        else:
            check_answer(close, "scale every gradient by the same factor, max_norm / joint norm: the norm is taken "
                         "over all parameters together, not one tensor at a time")


def joint_norm(model: nn.Module) -> float:
    return math.sqrt(sum(float((p.grad**2).sum()) for p in model.parameters()))


def clip_each(model: nn.Module, max_norm: float) -> float:  # a slip: each tensor by its own norm
    norm = joint_norm(model)
    for p in model.parameters():
        torch.nn.utils.clip_grad_norm_(p, max_norm)
    return norm


def norm_after(model: nn.Module, max_norm: float) -> float:  # a slip: the norm returned after clipping
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    return joint_norm(model)


def always(model: nn.Module, max_norm: float) -> float:  # a slip: rescaled to max_norm whatever the norm
    norm = joint_norm(model)
    for p in model.parameters():
        p.grad.mul_(max_norm / norm)
    return norm


def squared(model: nn.Module, max_norm: float) -> float:  # a slip: ‖g‖², the square root forgotten
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm).item() ** 2


grade("clip_gradients", clip_gradients, check_clip_gradients)
demonstrate(check_clip_gradients, {"no norm returned": lambda model, max_norm: None, "the norm after clipping":
                                   norm_after, "‖g‖², no square root": squared, "each tensor clipped by its own norm":
                                   clip_each, "rescaled even below max_norm": always})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(clip_gradients):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def clip_gradients(model: nn.Module, max_norm: float) -> float:
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        norm = math.sqrt(sum(float((g**2).sum()) for g in grads))
        if norm > max_norm:
            for g in grads:
                g.mul_(max_norm / norm)
        return norm

    grade("clip_gradients", clip_gradients, check_clip_gradients)

# %% [markdown]
# **3. The loop, yours.** Write `my_epoch(model, loader, optimizer, lr_at)`: the first epoch of `fit`'s loop — for
# each batch, set the rate `lr_at(step)` (step 0, 1, …) on every parameter group, compute the cross-entropy of the
# logits, zero the gradients, back-propagate, step — returning the batches' losses (floats). The check trains two
# copies of a small ConViT on the same batches, with your loop and with the package's `fit` (the next chapter's):
# losses and weights must be identical.
# It watches your optimizer at each of its steps (the rate it is given, the gradients it finds), so it can name a
# step your loop leaves out.

# %%
my_epoch = ...  # your answer: def my_epoch(model, loader, optimizer, lr_at): ...

# %%
import contextlib
import copy
import io

from torch.utils.data import TensorDataset


def check_my_epoch(fn) -> None:
    from convit_edu.schedule import deit_lr  # the package's loop and its parts (chapter 11_fit): the reference
    from convit_edu.teaching_loop import fit, param_groups

    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(48, 3, 32, 32), torch.randint(0, 10, (48,))), batch_size=16)
    yours, reference = small_model("convit_tiny", seed=0), small_model("convit_tiny", seed=1)
    reference.load_state_dict(yours.state_dict())
    with contextlib.redirect_stdout(io.StringIO()):  # fit prints its epoch line
        fit(reference, loader, loader, 1, lr=5e-4, warmup_epochs=0.5)
    schedule = (len(loader), round(0.5 * len(loader)), 5e-4 * 16 / 512, 1e-5, 1e-6)  # fit's, for 1 epoch
    optimizer = torch.optim.AdamW(param_groups(yours, 0.05), lr=1e-6)
    batches, seen, optimizer_step = list(loader), [], optimizer.step

    def watched_step(*args, **kwargs):  # before each step: its rates, its gradients, and those of its batch alone
        images, labels = batches[min(len(seen), len(batches) - 1)]
        alone = copy.deepcopy(yours)
        alone.zero_grad()
        loss = F.cross_entropy(alone(images), labels)
        loss.backward()
        seen.append(([g["lr"] for g in optimizer.param_groups], [p.grad.clone() for p in yours.parameters()],
                     [p.grad for p in alone.parameters()], loss.item()))
        return optimizer_step(*args, **kwargs)

    optimizer.step = watched_step
    losses = fn(yours, loader, optimizer, lambda step: deit_lr(step, *schedule))
    check_answer(len(seen) == len(loader), f"{len(seen)} steps of the optimizer you are given for {len(loader)} batches: "
                 "one optimizer.step() per batch")
    for step, (rates, grads, alone, loss) in enumerate(seen):
        check_answer(rates == [deit_lr(step, *schedule)] * len(rates), f"step {step} ran at rates {rates}, not "
                     f"lr_at({step}) = {deit_lr(step, *schedule):.3g}: set the rate of every parameter group before "
                     "optimizer.step()")
        previous = seen[step - 1][1] if step else [torch.zeros_like(g) for g in grads]
        added_up = all(torch.allclose(g, a + p, atol=1e-6) for g, a, p in zip(grads, alone, previous))
        check_answer(step == 0 or not added_up, f"at step {step} the gradients are those of this batch *plus* the "
                     "previous ones: zero the gradients every step (optimizer.zero_grad()), or they add up over batches")
        check_answer(all(torch.allclose(g, a, atol=1e-6) for g, a in zip(grads, alone)), f"at step {step} the gradients "
                     "are not those of the batch's mean cross-entropy: F.cross_entropy(model(images), labels)")
    check_answer(len(losses) == len(seen) and all(math.isclose(a, s[3], rel_tol=1e-6) for a, s in zip(losses, seen)),
                 "your losses are not the batches' losses: each is the model's loss on its batch before that batch's "
                 "step, as a float")
    same = all(torch.equal(a, b) for a, b in zip(yours.state_dict().values(), reference.state_dict().values()))
    check_answer(same, "every step is right but the weights differ from fit's: only optimizer.step() should change them")


def a_loop(zero_grad: bool = True, set_lr: bool = True, step: bool = True, reduction: str = "mean",
           decay_by_hand: bool = False, record: bool = True):
    """A loop that makes the slips asked for: the wrong answers the check is shown on."""
    def epoch(model, loader, optimizer, lr_at):
        losses = []
        for i, (images, labels) in enumerate(loader):
            for group in optimizer.param_groups if set_lr else ():
                group["lr"] = lr_at(i)
            loss = F.cross_entropy(model(images), labels, reduction=reduction)
            if zero_grad:
                optimizer.zero_grad()
            loss.backward()
            if step:
                optimizer.step()
            if decay_by_hand:
                with torch.no_grad():
                    for p in model.parameters():
                        p.mul_(1 - 1e-4)
            losses += [loss.item()] if record else []
        return losses
    return epoch


grade("my_epoch", my_epoch, check_my_epoch)
demonstrate(check_my_epoch, {"no optimizer step": a_loop(step=False), "the rate never set": a_loop(set_lr=False),
                             "no zero_grad": a_loop(zero_grad=False), "the batch's loss summed": a_loop(reduction="sum"),
                             "no losses returned": a_loop(record=False),
                             "weight decay by hand as well": a_loop(decay_by_hand=True)})

# %% tags=["solution"] jupyter={"source_hidden": true}
if reveal(my_epoch):  # a reference answer: runs only with CONVIT_EDU_SOLUTIONS=1
    def my_epoch(model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer, lr_at) -> list[float]:
        model.train()
        losses = []
        for step, (images, labels) in enumerate(loader):
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step)
            loss = F.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses

    grade("my_epoch", my_epoch, check_my_epoch)
