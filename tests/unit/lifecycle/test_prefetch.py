"""Tests of lifecycle/chunk_data.py `prefetched`: a task's input read ahead by a thread, the same
items in the same order, the reader's failure raised in the consumer, an early stop ending the reader."""
from __future__ import annotations

import threading

import pytest

from lifecycle.chunk_data import prefetched
from tests.waiting import wait_for


def test_every_item_in_order_also_past_the_read_ahead_depth():
    assert list(prefetched(iter(range(1000)), depth=3)) == list(range(1000))
    assert list(prefetched(iter([]))) == []


def test_the_readers_exception_is_raised_in_the_consumer_after_the_items_before_it():
    def source():
        yield 1
        yield 2
        raise ValueError("socket closed")

    got = []
    with pytest.raises(ValueError, match="socket closed"):
        for x in prefetched(source(), depth=1):
            got.append(x)
    assert got == [1, 2]


def test_the_reader_reads_ahead_while_the_consumer_works():
    read = []

    def source():
        for i in range(5):
            read.append(i)
            yield i

    it = prefetched(source(), depth=10)
    assert next(it) == 0
    wait_for(lambda: len(read) == 5, 10, "the reader to read past the item the consumer holds", poll_s=0.01)
    assert read == [0, 1, 2, 3, 4]
    assert list(it) == [1, 2, 3, 4]


def test_a_consumer_that_stops_early_stops_the_reader():
    pulled = []

    def endless():
        i = 0
        while True:
            pulled.append(i)
            yield i
            i += 1

    before = {t.ident for t in threading.enumerate()}
    it = prefetched(endless(), depth=2)
    assert next(it) == 0
    it.close()
    wait_for(lambda: not any(t.name == "iox-prefetch" and t.ident not in before for t in threading.enumerate()),
             10, "the reader thread to end", poll_s=0.02)
    assert len(pulled) <= 5  # the depth, the item in hand, one being put: no more
