"""Fixtures shared by the unit tests."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Run a test on one intra-op thread: tiny models run fastest that way, and on a shared 2-core machine
    (or beside the subprocesses a test starts) two threads mostly wait for each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
