"""The acknowledged-offsets log (server/write_buffer/ack_log.py): what `record` returned from is what the
next open reads, concurrent records share fsyncs and keep the highest offset, a new epoch or topic
incarnation starts over, a crash's cut-short line and a long log are handled, and a failed fsync
refuses every later record."""
from __future__ import annotations

import os
import threading

import pytest

from iox_spark.server.write_buffer import ack_log
from iox_spark.server.write_buffer.ack_log import ACK_LOG_FILE, AckedOffsets, AckLog, AckLogBroken, AckLogFormatMismatch


def test_what_was_recorded_is_read_at_the_next_open(tmp_path):
    log = AckLog(str(tmp_path))
    assert log.at_start == {}
    log.record("iox.a", "id-a", 0, {0: 4, 1: 2})
    log.record("iox.a", "id-a", 0, {0: 3, 1: 7})  # a request acknowledged earlier, confirmed later
    log.record("iox.b", None, 2, {0: 0})
    log.close()
    assert AckLog(str(tmp_path)).at_start == {"iox.a": AckedOffsets("id-a", 0, {0: 4, 1: 7}),
                                              "iox.b": AckedOffsets(None, 2, {0: 0})}


def test_a_new_epoch_or_topic_incarnation_starts_over(tmp_path):
    log = AckLog(str(tmp_path))
    log.record("iox.a", "id-a", 0, {0: 40, 1: 9})
    log.record("iox.a", "id-a", 1, {0: 5})
    log.record("iox.b", "id-b", 0, {0: 40})
    log.record("iox.b", "id-b2", 0, {1: 3})
    log.close()
    assert AckLog(str(tmp_path)).at_start == {"iox.a": AckedOffsets("id-a", 1, {0: 5}),
                                              "iox.b": AckedOffsets("id-b2", 0, {1: 3})}


def test_concurrent_records_are_each_durable_and_share_fsyncs(tmp_path, monkeypatch):
    syncs = []
    real = os.fdatasync
    monkeypatch.setattr(ack_log.os, "fdatasync", lambda fd: (syncs.append(fd), real(fd)))
    log = AckLog(str(tmp_path))
    n_threads, per_thread = 8, 200

    def run(t):
        for i in range(per_thread):
            log.record("iox.a", "id", 0, {t % 2: t * per_thread + i})

    threads = [threading.Thread(target=run, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    assert 0 < len(syncs) <= n_threads * per_thread
    hi = {0: max(t * per_thread + per_thread - 1 for t in range(0, n_threads, 2)),
          1: max(t * per_thread + per_thread - 1 for t in range(1, n_threads, 2))}
    assert AckLog(str(tmp_path)).at_start == {"iox.a": AckedOffsets("id", 0, hi)}


def test_a_line_a_crash_cut_short_is_ignored(tmp_path):
    log = AckLog(str(tmp_path))
    log.record("iox.a", "id", 0, {0: 4})
    log.close()
    with open(tmp_path / ACK_LOG_FILE, "ab") as f:
        f.write(b'{"topic":"iox.a","topic_id":"id","epoch":0,"hi":{"0":9')  # never fsynced, never acknowledged
    assert AckLog(str(tmp_path)).at_start == {"iox.a": AckedOffsets("id", 0, {0: 4})}


def test_a_long_log_is_rewritten_with_one_line_per_topic(tmp_path, monkeypatch):
    monkeypatch.setattr(ack_log, "COMPACT_AT_BYTES", 2000)
    log = AckLog(str(tmp_path))
    for i in range(200):
        log.record(f"iox.t{i % 3}", "id", 0, {0: i})
        assert os.path.getsize(tmp_path / ACK_LOG_FILE) <= 2000 + 200
    log.close()
    assert AckLog(str(tmp_path)).at_start == {f"iox.t{i % 3}": AckedOffsets("id", 0, {0: i}) for i in (197, 198, 199)}


def test_another_format_is_refused(tmp_path):
    (tmp_path / ACK_LOG_FILE).write_text('{"format": "iox-acked-offsets", "version": 99}\n')
    with pytest.raises(AckLogFormatMismatch, match="version 1"):
        AckLog(str(tmp_path))


def test_a_failed_fsync_refuses_this_record_and_every_later_one(tmp_path, monkeypatch):
    log = AckLog(str(tmp_path))
    log.record("iox.a", "id", 0, {0: 1})

    def failing(_fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(ack_log.os, "fdatasync", failing)
    with pytest.raises(AckLogBroken, match="Input/output error") as ei:
        log.record("iox.a", "id", 0, {0: 2})
    assert ei.value.errno == 5
    monkeypatch.undo()
    with pytest.raises(AckLogBroken):  # a page the kernel failed to write back may be gone: for good
        log.record("iox.a", "id", 0, {0: 3})
    log.close()
