"""Keep freed heap memory mapped, so that each step's temporaries reuse pages already faulted in.

A fit allocates the same activation-sized temporaries at every step and frees them at its end. glibc
gives memory back to the kernel in two ways: it returns the top of the heap once more than a
threshold lies free there, and it serves every allocation above the mmap threshold (128 KiB, raised
on its own up to 32 MiB as blocks are freed) with a fresh ``mmap`` that ``free`` unmaps. Either way the
next step's temporaries are written to freshly mapped pages, whose first write costs several times the
arithmetic of a small network.
``M_TOP_PAD`` keeps that much free memory at the top of the heap, and ``M_MMAP_THRESHOLD`` at glibc's
largest, 32 MiB, serves the blocks up to that size from the heap too. (Setting ``M_TOP_PAD`` alone
fixes the mmap threshold at 128 KiB, which sends every larger tensor to ``mmap``. Serving every block
from the heap, ``M_MMAP_MAX = 0``, lets a loop of allocations of varying size grow the process several
fold; docs/benchmarks-speed.md.) No library
does this for torch on the CPU (jemalloc or tcmalloc through ``LD_PRELOAD`` serve too, but must be
installed and set before Python starts).

It is process-wide, so importing bnn-zoo never calls it: the command line does, for its own process
and (through the environment) the processes it starts, and a Python user may.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TOP_PAD, M_MMAP_THRESHOLD = -2, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 * 2**20  # glibc's largest (its dynamic threshold's ceiling on 64-bit systems)


def keep_freed_memory(mib: int = 64) -> bool:
    """Ask glibc to keep ``mib`` MiB of freed memory at the top of the heap (``mallopt(M_TOP_PAD)``) and
    to serve blocks up to 32 MiB from the heap (``mallopt(M_MMAP_THRESHOLD)``), in this process and,
    through ``MALLOC_TOP_PAD_`` and ``MALLOC_MMAP_THRESHOLD_``, in the processes it starts. Numbers do
    not change, only time (docs/benchmarks-speed.md). The process keeps up to ``mib`` MiB more resident
    after a peak, and freed blocks of up to 32 MiB inside the heap stay resident for reuse.

    Args:
        mib: the free memory to keep, in MiB.

    Returns:
        Whether the setting took effect (False where the C library is not glibc).
    """
    if not sys.platform.startswith("linux"):
        return False
    pad = int(mib) * 2**20
    os.environ.setdefault("MALLOC_TOP_PAD_", str(pad))
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(MMAP_THRESHOLD))
    try:
        mallopt = ctypes.CDLL(None).mallopt
        return bool(mallopt(M_TOP_PAD, pad)) and bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    except (AttributeError, OSError):  # musl and other C libraries have no mallopt
        return False
