"""The `iox` command line's own logic, without a server: JSON output of query results
(`json_value`), `iox write` in several requests with its progress bar (`write_input` against a
fake client), and the replay progress status reports (`server.consume.recovery.replay_progress`)."""
from __future__ import annotations

import datetime as dt
import io
import json
import math
import types
from decimal import Decimal

import grpc
import pyarrow as pa
import pytest

from iox_spark.server.cli import main as cli
from iox_spark.server.cli.main import write_input
from iox_spark.server.cli.output import json_value, print_table
from iox_spark.server.consume.recovery import replay_progress
from iox_spark.server.write_buffer.write_token import WriteToken, parse_token

U64_MAX = (1 << 64) - 1


# -- iox sql --format json ---------------------------------------------------------------

def test_every_number_is_a_json_number():
    row = {"i": -(1 << 63), "u": Decimal(U64_MAX), "u10": Decimal("10"), "f": 1.5, "g": 1e300, "tiny": 5e-324,
           "d": Decimal("12345678901234567890.125"), "neg0": -0.0, "t": True, "n": None, "s": 'a"\n\u00e9'}
    text = json_value(row)
    back = json.loads(text, parse_float=Decimal)
    assert back == {"i": -(1 << 63), "u": U64_MAX, "u10": 10, "f": Decimal("1.5"), "g": Decimal("1e300"),
                    "tiny": Decimal("5e-324"), "d": Decimal("12345678901234567890.125"), "neg0": Decimal("-0.0"),
                    "t": True, "n": None, "s": 'a"\n\u00e9'}
    assert '"u": 18446744073709551615' in text and '"u10": 10,' in text  # numbers, not strings


@pytest.mark.parametrize("v", [math.nan, math.inf, -math.inf, Decimal("NaN"), Decimal("Infinity"), Decimal("-Infinity")])
def test_nan_and_infinities_are_null(v):
    assert json_value(v) == "null"
    assert json.loads(json_value({"x": v, "y": [v, 1.0]})) == {"x": None, "y": [None, 1.0]}


def test_nested_binary_and_temporal_values():
    ts = dt.datetime(2023, 11, 14, 22, 13, 20, tzinfo=dt.timezone.utc)
    out = json.loads(json_value({"l": [1, Decimal("2"), None], "m": [("k", 1.25)], "st": {"a": {"b": 3}},
                                 "b": b"\x00\xff", "ts": ts, "day": dt.date(2024, 1, 2)}))
    assert out == {"l": [1, 2, None], "m": [["k", 1.25]], "st": {"a": {"b": 3}}, "b": "AP8=",
                   "ts": "2023-11-14 22:13:20+00:00", "day": "2024-01-02"}


def test_print_table_json_writes_one_object_per_row():
    t = pa.table({"host": ["a", "b"], "free": pa.array([Decimal(10), Decimal(U64_MAX)], pa.decimal128(20, 0)),
                  "v": [1.5, float("nan")], "n": pa.array([1, None], pa.int64())})
    out = io.StringIO()
    print_table(t, "json", out)
    assert [json.loads(line) for line in out.getvalue().splitlines()] == [
        {"host": "a", "free": 10, "v": 1.5, "n": 1}, {"host": "b", "free": U64_MAX, "v": None, "n": None}]


# -- iox write ---------------------------------------------------------------------------

class _RpcError(grpc.RpcError):
    def code(self):
        return grpc.StatusCode.INVALID_ARGUMENT

    def details(self):
        return "1 bad line(s), nothing written: line 1: nope"


class FakeClient:
    def __init__(self, fail_at: int | None = None):
        self.requests = []
        self.fail_at = fail_at

    def write(self, database, body, precision="ns"):
        if len(self.requests) == self.fail_at:
            raise _RpcError()
        self.requests.append((database, bytes(body), precision))
        n = len(self.requests)
        return {0: n, 1: 10 - n}  # the token of each request: the merge keeps the highest offset

    def write_response(self, database, body, precision="ns"):
        offsets = self.write(database, body, precision)
        return types.SimpleNamespace(token=types.SimpleNamespace(offsets=offsets, epoch=2, topic_id="id-1"),
                                     topic=f"iox_{database}", token_text="(printed)")


class _Tty(io.StringIO):
    def isatty(self):
        return True


BODY = b"".join(b"cpu,host=h%d v=%d %d\n" % (i, i, i) for i in range(100))


def test_write_input_sends_pieces_at_line_ends_and_merges_the_tokens():
    c = FakeClient()
    err = io.StringIO()  # not a terminal: no progress bar
    token = write_input(c, "db", BODY, "ms", 300, err=err)
    assert b"".join(body for _, body, _ in c.requests) == BODY
    assert len(c.requests) > 3 and all(len(body) <= 300 and body.endswith(b"\n") for _, body, _ in c.requests)
    assert {(db, p) for db, _, p in c.requests} == {("db", "ms")}
    assert token == {0: len(c.requests), 1: 9}
    assert err.getvalue() == ""
    # a small input: one request, as it is
    c = FakeClient()
    assert write_input(c, "db", b"m v=1 1", "ns", 300, err=err) == {0: 1, 1: 9}
    assert c.requests == [("db", b"m v=1 1", "ns")]
    c = FakeClient()
    write_input(c, "db", b"", "ns", 300, err=err)  # an empty input is still one (empty) request
    assert c.requests == [("db", b"", "ns")]


def test_write_input_draws_a_progress_bar_on_a_terminal(monkeypatch):
    err = _Tty()
    import tqdm

    monkeypatch.setattr(tqdm.tqdm, "__init__", _no_delay(tqdm.tqdm.__init__))
    write_input(FakeClient(), "db", BODY, "ns", 300, err=err)
    out = err.getvalue()
    assert "writing" in out and "100%" in out and f"{len(BODY) / 1024:.2f}k" in out


def _no_delay(init):
    def wrapper(self, *a, **kw):
        kw["delay"] = 0  # draw at once (the command waits half a second so quick writes draw nothing)
        return init(self, *a, **kw)

    return wrapper


def test_a_failing_later_request_says_what_was_written_before_it():
    c = FakeClient(fail_at=2)
    with pytest.raises(cli._WriteFailed) as ei:
        write_input(c, "db", BODY, "ns", 300, err=io.StringIO())
    msg = ei.value.message
    sent = sum(len(b) for _, b, _ in c.requests)
    lines = sum(b.count(b"\n") for _, b, _ in c.requests)
    assert msg.startswith("INVALID_ARGUMENT: 1 bad line(s)") and "request 3" in msg
    assert f"[{sent}, " in msg and f"from line {lines + 1} of the input" in msg and f"the {sent} bytes" in msg
    assert '{"0": 2, "1": 9}' in msg
    # the first request failing: the server's message alone
    with pytest.raises(cli._WriteFailed) as ei:
        write_input(FakeClient(fail_at=0), "db", BODY, "ns", 300, err=io.StringIO())
    assert ei.value.message == "INVALID_ARGUMENT: 1 bad line(s), nothing written: line 1: nope"


def test_write_reads_a_file_through_a_map(tmp_path, monkeypatch, capsys):
    f = tmp_path / "in.lp"
    f.write_bytes(BODY)
    c = FakeClient()
    monkeypatch.setattr("iox_spark.server.api.client.IoxClient", lambda addr, token=None: c)
    assert cli.main(["write", "--db", "db", "--batch-bytes", "1k", str(f)]) == 0
    assert b"".join(b for _, b, _ in c.requests) == BODY and len(c.requests) == 3
    out = json.loads(capsys.readouterr().out)
    assert out["token"] == {"0": 3, "1": 9}
    # the printable token of the whole input: the merged offsets, in the last answer's topic and epoch
    assert parse_token(out["write_token"]) == WriteToken("iox_db", "id-1", 2, {0: 3, 1: 9})
    empty = tmp_path / "empty.lp"
    empty.write_bytes(b"")
    assert cli.main(["write", "--db", "db", str(empty)]) == 0
    c.fail_at = len(c.requests)
    assert cli.main(["write", "--db", "db", str(f)]) == 1
    assert capsys.readouterr().err.startswith("error: INVALID_ARGUMENT: ")


# -- replay progress ---------------------------------------------------------------------

def test_replay_progress_counts_offsets_from_the_start_to_the_target():
    frm, until = {0: 10, 1: 0, 2: 5}, {0: 19, 1: 4, 2: 5}  # 10 + 5 + 1 offsets to replay
    assert replay_progress(frm, until, {0: 9, 1: -1, 2: 4}) == (0, 16)  # nothing applied yet
    assert replay_progress(frm, until, {0: 14, 1: 4}) == (10, 16)  # partition 2 not applied at all
    assert replay_progress(frm, until, {0: 19, 1: 4, 2: 5}) == (16, 16)
    assert replay_progress(frm, until, {0: 500, 1: 40, 2: 6}) == (16, 16)  # newer writes do not count
    assert replay_progress({}, {}, {0: 3}) == (0, 0)
    assert replay_progress({0: 8}, {0: 7}, {0: 7}) == (0, 0)  # an empty range
