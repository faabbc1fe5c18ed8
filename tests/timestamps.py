"""Times the tests write their points at, and the units of those times.

`T0` is 2023-11-14T22:13:20Z in nanoseconds: inside one UTC day partition, long past any
late-arrival window, and inside every retention period the tests do not set on purpose.
"""
from __future__ import annotations

__all__ = ["T0", "S", "US"]

#: 2023-11-14T22:13:20Z, ns since the epoch
T0 = 1_700_000_000_000_000_000
#: ns per second
S = 1_000_000_000
#: ns per microsecond (Spark keeps microseconds)
US = 1_000
