"""Instructions retired by the calling thread (Linux perf_event_open, user space only).

Step times on the GPU machine swing by ±10-20% between and within processes, more than the few
percent a profiler's part costs. A launch-bound step is the host thread's work, and the
instructions that thread retires are nearly deterministic: they compare configurations where
timings cannot. `Counter()` raises OSError where the kernel or the container allows no counters.
"""

from __future__ import annotations

import ctypes
import os
import struct

_SYS_PERF_EVENT_OPEN = {"x86_64": 298, "aarch64": 241}[os.uname().machine]
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


class Counter:
    """Instructions retired in user space by the thread that made it, from now on."""

    def __init__(self) -> None:
        # struct perf_event_attr, PERF_ATTR_SIZE_VER5 (112 bytes): type PERF_TYPE_HARDWARE,
        # config PERF_COUNT_HW_INSTRUCTIONS, flags exclude_kernel | exclude_hv (enabled at once).
        attr = bytearray(112)
        struct.pack_into("IIQ", attr, 0, 0, 112, 1)
        struct.pack_into("Q", attr, 40, (1 << 5) | (1 << 6))
        buf = (ctypes.c_char * 112).from_buffer(attr)
        fd = _libc.syscall(_SYS_PERF_EVENT_OPEN, buf, 0, -1, -1, 0)  # this thread, any CPU
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, f"perf_event_open: {os.strerror(e)}")
        self.fd = int(fd)

    def read(self) -> int:
        return struct.unpack("Q", os.read(self.fd, 8))[0]

    def close(self) -> None:
        os.close(self.fd)


def counter_or_none() -> Counter | None:
    try:
        return Counter()
    except OSError:
        return None


if __name__ == "__main__":
    c = Counter()
    a = c.read()
    sum(range(1_000_000))
    print(f"sum(range(1e6)): {c.read() - a:,} instructions")
