"""CPU threads for training: the worker computes with N OpenMP threads, every other thread with one.

Why: GNU OpenMP (the libgomp that PyTorch's wheels ship) gives each thread that runs a parallel region its own
team of threads, which stay alive in its pool. As soon as more OpenMP threads exist than CPUs, libgomp stops
spin-waiting between parallel regions ("throttled" spin, 100 iterations) and its threads sleep on a futex
instead, so every small kernel pays a wake-up. hivemind runs the optimizer step and the averaging bookkeeping on
its own threads, the daemon builds the model on others: with torch's default, their teams pushed the training
step of a 2-core peer down by a third (measured with benchmarks/solo_overhead.py when this was fixed).

So the process-wide setting is one thread (every thread initialises its OpenMP thread count from it on first
use), and the worker alone raises its own, thread-local, OpenMP count to N, and MKL's (the matrix products),
which MKL keeps apart from OpenMP's. A team, once made, stays for the life of the process: the daemon reserves the
threads before any thread runs torch (its model-building phase). Reserved after the model and the optimizer were
built, as it was until 2026-12-02, the build thread's and the loop thread's teams were already there, and a
2-thread solo peer ran at 282 samples/s instead of 390.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Optional

import torch

__all__ = ["reserve_threads_for_worker", "use_threads_in_this_thread"]

logger = logging.getLogger(__name__)


def reserve_threads_for_worker(threads: int) -> int:
    """On the main thread, before any torch work: the worker's thread count (0: torch's default); others get 1."""
    wanted = threads or torch.get_num_threads()
    if _libgomp() is not None:
        torch.set_num_threads(1)
    return wanted


def use_threads_in_this_thread(threads: int) -> None:
    """In the worker thread: compute with `threads` OpenMP threads, without raising the other threads' count."""
    gomp = _libgomp()
    torch.get_num_threads()  # PyTorch initialises this thread's count from the process-wide one (1) on first use
    if gomp is None:
        torch.set_num_threads(threads)  # another OpenMP runtime: the process-wide setting is all there is
    else:
        gomp.omp_set_num_threads(threads)  # thread-local in libgomp; torch.get_num_threads() follows it
        # MKL keeps its own per-thread count, which torch's initialisation above set to 1: left there, every matrix
        # product of the worker ran on one thread (a 2-thread peer's sgemm took 2x as long).
        set_mkl_threads = _mkl_local_thread_setter()
        if set_mkl_threads is not None:
            set_mkl_threads(threads)
    logger.debug("training with %d CPU threads", torch.get_num_threads())


def _libgomp() -> Optional[ctypes.CDLL]:
    return _loaded_library(lambda name: "libgomp" in name and name.endswith(".so.1"))


def _mkl_local_thread_setter():
    """MKL_Set_Num_Threads_Local of MKL's C interface (the count by value), statically linked into PyTorch's x86
    wheels; None where there is no MKL."""
    torch_cpu = _loaded_library(lambda name: name == "libtorch_cpu.so")
    function = getattr(torch_cpu, "MKL_Set_Num_Threads_Local", None) if torch_cpu is not None else None
    if function is not None:
        function.argtypes, function.restype = [ctypes.c_int], None
    return function


def _loaded_library(matches) -> Optional[ctypes.CDLL]:
    """A shared library this process has already loaded whose file name `matches`, or None."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if matches(line.rstrip().rsplit("/", 1)[-1])})
    except OSError:
        return None
    return ctypes.CDLL(paths[0]) if paths else None
