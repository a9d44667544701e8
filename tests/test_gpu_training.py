"""The training loop's phases of the GPU check (chapter 44_gpu_training): the data wait's start-up apart from the
steady state, read from progress lines (made-up ones counted by hand, and the very lines `Progress` prints), and the
sync-debug notice that is no sync."""

from types import SimpleNamespace

import pytest

from convit_edu.gpu_check_training import data_wait_split, is_sync_warning
from convit_edu.run_records import Progress


def line(epoch: int, step: int, rate: int, wait: float, epochs: int = 2, steps: int = 30) -> str:
    return (f"epoch {epoch}/{epochs} step {step}/{steps} loss 6.9000 lr 1.000e-03 {rate} img/s data wait {wait:.2f} s "
            f"(10 %)")


def test_the_first_interval_is_the_start_up_and_the_rest_the_steady_state():
    """Batch 100: 500 img/s at step 10 is 2 s (1.6 s waited); 800 at step 20 is 2.5 s, 1 000 at step 30 3 s, 0.1 s
    waited in each: the steady state is 20 steps in 1 s, 2 000 img/s, a fifth of it waiting."""
    epoch, = data_wait_split([line(1, 10, 500, 1.6), line(1, 20, 800, 0.1), line(1, 30, 1000, 0.1)], batch=100)
    assert epoch["startup"] == {"steps": 10, "seconds": 2.0, "wait_s": 1.6, "wait_share": 0.8, "images_per_s": 500.0}
    steady = epoch["steady"]
    assert (steady["steps"], steady["seconds"], steady["wait_s"]) == (20, pytest.approx(1.0), pytest.approx(0.2))
    assert steady["wait_share"] == pytest.approx(0.2) and steady["images_per_s"] == pytest.approx(2000)


def test_each_epoch_is_split_apart_other_lines_are_ignored_and_one_interval_has_no_steady_state():
    lines = ["epochs 1-2 of 30 steps: a line every 10 steps and after each evaluated epoch", line(1, 10, 500, 1.0),
             line(1, 30, 1000, 0.5), "epoch 1  step 30  train_loss 6.8  lr 0.001  images_per_s 1000",
             line(2, 30, 600, 2.0)]
    first, second = data_wait_split(lines, batch=100)
    assert first["epoch"] == 1 and first["steady"]["steps"] == 20 and first["steady"]["seconds"] == pytest.approx(1)
    assert second["epoch"] == 2 and second["steady"] is None and second["startup"]["seconds"] == pytest.approx(5)


def test_a_rate_printed_as_zero_cannot_time_its_interval():
    with pytest.raises(ValueError, match="at 0 img/s its interval cannot be timed"):
        data_wait_split([line(1, 10, 0, 1.0)], batch=1)


def test_the_lines_progress_prints_are_the_lines_the_split_reads(capsys):
    """The reader follows the printer: a `Progress` in lines mode, as `convit-edu train --progress lines` prints."""
    progress = Progress("lines", epochs=3, log_every=10)
    state = SimpleNamespace(epoch=1, step=10, steps_per_epoch=31, loss=6.5)
    progress.step(state, lr=1e-3, images_per_s=1234.4, data_wait=0.5, interval=2.0)
    state.step = 31
    progress.step(state, lr=1e-3, images_per_s=2468.6, data_wait=0.25, interval=1.0)
    epoch, = data_wait_split(capsys.readouterr().out.splitlines(), batch=64)
    assert epoch["epoch"] == 2 and epoch["startup"]["steps"] == 10 and epoch["startup"]["wait_s"] == 0.5
    assert epoch["startup"]["seconds"] == pytest.approx(640 / 1234) and epoch["steady"]["steps"] == 21
    assert epoch["steady"]["seconds"] == pytest.approx(31 * 64 / 2469 - 640 / 1234)


def test_only_a_synchronising_call_counts_as_a_sync_not_the_modes_notice():
    """torch's two messages, as its CUDA build words them (libtorch_python, libc10_cuda): the notice printed once when
    sync-debug mode is switched on mentions "synchronizing operations" and is no sync (the H200 check's false FAIL)."""
    notice = UserWarning("Synchronization debug mode is a prototype feature and does not yet detect all "
                         "synchronizing operations")
    assert not is_sync_warning(notice)
    assert is_sync_warning(UserWarning("called a synchronizing CUDA operation (Triggered internally at ...)"))
