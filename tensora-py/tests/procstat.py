"""What /proc says about this process, for the tests that bound memory."""


def rss_kib(field: str) -> int:
    """`VmRSS` (now) or `VmHWM` (the peak so far, or since it was reset through
    `/proc/self/clear_refs`) of this process, in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")
