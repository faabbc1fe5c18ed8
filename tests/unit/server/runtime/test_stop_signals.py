"""server/runtime/stop_signals.py: SIGTERM and SIGINT stop the server through `wait_for_stop`
(never the signal's default death), SIGHUP runs its callback in a thread of its own."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from iox_spark.server.runtime.stop_signals import StopSignals


@pytest.fixture
def restore_handlers():
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_makes_the_waiting_thread_stop_the_server_once(restore_handlers, signum):
    signals = StopSignals(on_hup=lambda: None)
    signals.install()
    stopped, stops = threading.Event(), []

    def stop():
        stops.append(1)
        stopped.set()

    os.kill(os.getpid(), signum)  # handled in this, the main, thread
    signals.wait_for_stop(stopped, stop)
    assert signals.requested.is_set()
    assert stops == [1]


def test_a_server_stopped_by_other_means_ends_the_wait_without_a_second_stop(restore_handlers):
    signals = StopSignals(on_hup=lambda: None)
    stopped = threading.Event()
    stopped.set()
    signals.wait_for_stop(stopped, lambda: pytest.fail("stop called"))
    assert not signals.requested.is_set()


def test_sighup_runs_its_callback_in_another_thread(restore_handlers):
    ran = []
    done = threading.Event()

    def on_hup():
        ran.append(threading.current_thread() is not threading.main_thread())
        done.set()

    signals = StopSignals(on_hup=on_hup)
    signals.install()
    os.kill(os.getpid(), signal.SIGHUP)
    assert done.wait(10)
    assert ran == [True]
    assert not signals.requested.is_set()
