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


@pytest.fixture(autouse=True)
def own_file_list_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own cache folder (``XDG_CACHE_HOME``), so no test reads an image folder's file list
    cached by another test or by the user (``convit_edu.image_files.file_list_cache``)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
