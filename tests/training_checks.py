"""Helpers that the training tests and the DALI loader's training tests share."""

import torch
from torch import nn

from convit_edu.run_state import Callback


def assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), f"{k} differs"


class StopAt(Callback):
    """Ask for a clean stop after optimiser step `step` of epoch `epoch` (0-based epoch)."""

    def __init__(self, epoch: int, step: int):
        self.epoch, self.step = epoch, step

    def on_step_end(self, state):
        if (state.epoch, state.step) == (self.epoch, self.step):
            state.stop = True
