"""The worker computes with N CPU threads while every other thread of the daemon uses one."""

import threading

import torch

from swarmd.worker.threads import _libgomp, reserve_threads_for_worker, use_threads_in_this_thread


def test_only_the_worker_thread_gets_more_threads():
    before = torch.get_num_threads()
    try:
        wanted = reserve_threads_for_worker(3)
        assert wanted == 3
        seen = {}

        def worker():
            use_threads_in_this_thread(wanted)
            seen["worker"] = torch.get_num_threads()
            seen["worker mkl"] = _mkl_threads()

        def bystander():  # e.g. hivemind's optimizer thread, initialised after the worker
            seen["bystander"] = torch.get_num_threads()

        for target in (worker, bystander):
            thread = threading.Thread(target=target)
            thread.start()
            thread.join()
        assert seen["worker"] == 3
        if seen["worker mkl"] is not None:  # MKL's count is its own: left at 1, the matrix products ran on one thread
            assert seen["worker mkl"] == 3
        if _libgomp() is not None:  # PyTorch's wheels: GNU OpenMP, per-thread counts
            assert seen["bystander"] == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_zero_means_torchs_default():
    before = torch.get_num_threads()
    try:
        assert reserve_threads_for_worker(0) == before
    finally:
        torch.set_num_threads(before)


def _mkl_threads():
    """This thread's MKL thread count as PyTorch reports it, or None without MKL."""
    for line in torch.__config__.parallel_info().splitlines():
        if "mkl_get_max_threads()" in line:
            return int(line.split(":")[-1])
    return None
