"""server/runtime/gc_pauses.py: the startup heap is frozen without garbage; every collection is recorded."""
from __future__ import annotations

import gc
import weakref

from iox_spark.server.runtime.gc_pauses import GcPauseRecorder, freeze_startup_heap


class _Cycle:
    def __init__(self):
        self.me = self


def test_freezing_collects_first_then_freezes_what_is_alive():
    alive = [_Cycle() for _ in range(10)]
    garbage = weakref.ref(_Cycle())  # unreachable, in a reference cycle
    gc.unfreeze()
    try:
        frozen = freeze_startup_heap()
        assert garbage() is None  # collected before the freeze, so not frozen
        # other threads of the process (a test session's server) may free frozen objects meanwhile
        assert frozen > len(alive) and gc.get_freeze_count() > len(alive)
        assert not any(o is alive[0] for o in gc.get_objects())  # the living ones are frozen: never walked
        later = weakref.ref(_Cycle())
        gc.collect()
        assert later() is None  # a cycle made after the freeze is collected as usual
    finally:
        gc.unfreeze()


def test_every_collection_is_observed_with_its_generation_until_uninstalled():
    seen = []
    # no automatic collection meanwhile (another thread of the test session may allocate): only ours
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        rec = GcPauseRecorder(lambda gen, sec: seen.append((gen, sec))).install()
        try:
            rec.install()  # idempotent: one callback
            gc.collect(1)
            gc.collect(2)
            assert [g for g, _ in seen] == [1, 2]
            assert all(0 <= s < 5 for _, s in seen)
        finally:
            rec.uninstall()
        rec.uninstall()
        gc.collect()
        assert len(seen) == 2
    finally:
        if was_enabled:
            gc.enable()
