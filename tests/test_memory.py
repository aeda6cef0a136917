"""bz.keep_freed_memory: glibc keeps freed memory for the next step (bnn_zoo/memory.py)."""

import subprocess
import sys

import pytest

_MALLINFO = """
import ctypes, sys
import torch
import bnn_zoo as bz

class MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                  "keepcost")
    ]

libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "keep":
    assert bz.keep_freed_memory()
before = libc.mallinfo2().hblkhd
block = torch.empty(2**22)  # 16 MiB: past the threshold glibc starts with (128 KiB), under its largest
print(libc.mallinfo2().hblkhd - before)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_keep_freed_memory_serves_large_blocks_from_the_heap():
    """bz.keep_freed_memory (the command line's setting) keeps a 16 MiB tensor on the heap, where a freed
    block is reused, instead of a fresh mmap that free unmaps and the next step faults in again (with
    M_TOP_PAD alone, every block over 128 KiB went to mmap: 16 chains of the digits CNN took 2.2x as
    long a gradient)."""
    mapped = {}
    for mode in ("keep", "default"):
        out = subprocess.run([sys.executable, "-c", _MALLINFO, mode], capture_output=True, text=True, timeout=120)
        if "mallinfo2" in out.stderr:
            pytest.skip("no mallinfo2 (glibc before 2.33)")
        assert out.returncode == 0, out.stderr
        mapped[mode] = int(out.stdout.split()[-1])
    assert mapped["default"] >= 2**24  # the control: glibc's defaults map it
    assert mapped["keep"] < 2**20
