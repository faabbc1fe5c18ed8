"""Unit tests for the C path of server.write.line_protocol (server/write/_lpfast.c).

* the extension is built (a broken build fails here instead of quietly using the slow path);
* every test of test_line_protocol.py again, with the C path on (there it is off, see conftest.py);
* differential: the C path (`lp._parse_c`, None when it falls back) against the full Python parser
  (`lp._parse(..., fast=False)`) on the shared vectors, hypothesis documents, shaped, mutated and
  arbitrary bodies: whenever C answers, its result is the full parser's; it answers exactly when
  the full parser reports no error (valid UTF-8 bodies); parse_lines always equals the full parser;
* the things only C does: float conversion (exact fast path / Python's), SIMD scanning near the
  end of the body, buffers and null bitmaps, the GIL released while scanning, unique_keys.
"""
from __future__ import annotations

import importlib
import importlib.util
import math
import random
import struct
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from iox_spark.server.write import line_protocol as lp
from iox_spark.server.write.line_protocol import ColumnSpec, ParseResult, TableBatch, parse_lines


def _load_base():
    """test_line_protocol.py as a module of its own (its strategies, helpers and tests)."""
    path = Path(__file__).with_name("test_line_protocol.py")
    spec = importlib.util.spec_from_file_location("_lp_python_tests", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


base = _load_base()
DEFAULT_TIME = base.DEFAULT_TIME
I64_MIN, I64_MAX, U64_MAX = base.I64_MIN, base.I64_MAX, base.U64_MAX
HYPOTHESIS = settings(max_examples=200, deadline=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

# --------------------------------------------------------------------------
# every test of test_line_protocol.py, with the C path on (parse_lines tries it first)
# --------------------------------------------------------------------------

#: tests of the Python path's bulk match itself (they spy on it; the C path never reaches it)
_PYTHON_PATH_ONLY = {
    "test_bulk_match_cuts_values_out_of_the_tokens",
    "test_bulk_match_leaves_lines_with_empty_tokens_or_the_other_timestamp_form_to_the_loop",
    "test_bulk_match_takes_lines_without_timestamps",
}
for _name, _obj in list(vars(base).items()):
    if _name.startswith("test_") and callable(_obj) and _name not in _PYTHON_PATH_ONLY:
        globals()["test_with_c_" + _name[len("test_"):]] = _obj
del _name, _obj


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

def _valid_utf8(body) -> bool:
    if isinstance(body, str):
        try:
            body.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    try:
        bytes(body).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def expected_unique(tb: TableBatch) -> bool:
    """No two rows with the same (tag set, time), from the rows themselves."""
    tags = [c.name for c in tb.columns if c.role == "tag"]
    rows = tb.data.select(tags + ["time"]).to_pylist()
    keys = [(tuple(r[t] for t in tags), r["time"]) for r in rows]
    return len(set(keys)) == len(keys)


def _float_bits(tb: TableBatch):
    """Float columns as bit patterns (== does not tell -0.0 from 0.0)."""
    out = {}
    for c in tb.columns:
        if c.type == "float":
            out[c.name] = [None if v is None else struct.pack("<d", v) for v in tb.data.column(c.name).to_pylist()]
    return out


def assert_same(c: ParseResult, full: ParseResult):
    base.assert_same_result(c, full)
    for name, tb in c.tables.items():
        assert _float_bits(tb) == _float_bits(full.tables[name]), name


def differential(body, precision="ns", default_time=DEFAULT_TIME) -> ParseResult | None:
    """The C path's result (None: it fell back), after checking it against the full parser."""
    full = lp._parse(body, precision, default_time, fast=False)
    c = lp._parse_c(body, precision, default_time)
    if c is not None:
        assert full.errors == [], full.errors
        assert_same(c, full)
        for tb in c.tables.values():
            assert tb.unique_keys is expected_unique(tb)
        for tb in full.tables.values():
            assert tb.unique_keys is None
    elif _valid_utf8(body):
        # valid UTF-8: C falls back only for bad lines (or what it leaves to Python, not here)
        assert full.errors, "the C path fell back on a good body"
    assert_same(parse_lines(body, precision, default_time), full)
    return c


def handled(body, precision="ns", default_time=DEFAULT_TIME) -> ParseResult:
    c = differential(body, precision, default_time)
    assert c is not None, "the C path fell back"
    return c


def fell_back(body, precision="ns", default_time=DEFAULT_TIME):
    assert differential(body, precision, default_time) is None


# --------------------------------------------------------------------------
# the build
# --------------------------------------------------------------------------

def test_extension_is_built():
    mod = importlib.import_module("iox_spark.server.write._lpfast")  # ImportError: the build is broken
    assert lp._lpfast is mod
    assert callable(mod.parse)


def test_c_path_handles_a_bench_body():
    sys.path.insert(0, str(Path(__file__).resolve().parents[4]))
    try:
        from bench.harness import lp_batches
    finally:
        sys.path.pop(0)
    body = lp_batches("cpu", 5000, seed=1, t0_ns=1_700_000_000_000_000_000)[0]
    res = handled(body)
    assert res.lines == 5000 and list(res.tables) == ["cpu"]
    tb = res.tables["cpu"]
    assert [c.name for c in tb.columns] == ["host", "region", "requests", "usage_system", "usage_user", "time"]
    assert tb.unique_keys is True
    assert lp._parse_c(body + body, "ns", DEFAULT_TIME).tables["cpu"].unique_keys is False


def test_c_path_handles_strings_escapes_and_the_rest():
    body = (
        '# a comment\r\n'
        '\n'
        '  wea\\,ther\\ now,lo\\=c=S\\ F\\,CA,k\\\\x=\u00fc\u20ac '
        'temp=1.5e3,msg="say \\"hi\\"\\\\ \\n ok",n=-7i,u=18446744073709551615u,b=TRUE 1700000000\r\n'
        'weat\\\nher s="multi\nline, a=b" 2\n'
        'wea\\,ther\\ now,lo\\=c=x temp=-0.0,ok=f\n'
        'cpu,host=a usage=1,usage=2 3\n'
    )
    res = handled(body, "s")
    assert list(res.tables) == ["wea,ther now", "weat\\\nher", "cpu"]
    rows = res.tables["wea,ther now"].data.to_pylist()
    assert rows[0] == {"k\\x": "\u00fc\u20ac", "lo=c": "S F,CA", "b": True, "msg": 'say "hi"\\ \\n ok', "n": -7,
                       "ok": None, "temp": 1500.0, "u": U64_MAX, "time": 1_700_000_000_000_000_000}
    assert rows[1]["time"] == DEFAULT_TIME and rows[1]["ok"] is False
    assert res.tables["weat\\\nher"].data.column("s").to_pylist() == ["multi\nline, a=b"]
    assert res.tables["cpu"].data.column("usage").to_pylist() == [2.0]


@pytest.mark.parametrize("body", [
    "m f=1\nbad\n",  # a bad line
    "m f=1i\nm f=1.5",  # a column type conflict across lines
    "m,t=a t=1",  # a tag and a field of the same name
    "m f=1i,f=1",  # a field repeated with different types
    "m,t=a,t=b f=1",  # a tag repeated
    "m time=1",
    "m,time=a f=1",
    "m f=1 99999999999999999999",
    "m f=1 9223372037",  # with precision "s" below: does not fit in int64 ns
])
def test_c_path_falls_back_on_bad_lines(body):
    precision = "s" if body.endswith("9223372037") else "ns"
    assert lp._parse_c(body, precision, DEFAULT_TIME) is None
    fell_back(body, precision)


def test_c_path_falls_back_on_invalid_utf8():
    for body in (b"m,t=\xff f=1", b"m f=1\n# \xc3\x28 comment\n", b"m s=\"\xed\xa0\x80\"", b"m f=1 1\xf4\x90\x80\x80",
                 b"m\xc0\xaf f=1", b"m f=1\xe2\x82"):
        assert lp._parse_c(body, "ns", DEFAULT_TIME) is None
        assert_same(parse_lines(body, "ns", DEFAULT_TIME), lp._parse(body, "ns", DEFAULT_TIME, fast=False))
    assert lp._parse_c("m,t=\udcff f=1", "ns", DEFAULT_TIME) is None  # a lone surrogate in a str body
    # valid multi-byte UTF-8 of every length, at the end of the body too
    for body in ("m,t=\u00e9 f=1", "m,t=\u20ac f=1", "m,t=\U0001f680 f=1", "m f=\"\U0010ffff\"", "\ufeffm f=1"):
        handled(body.encode())


def test_body_types():
    body = 'm,t=\u00fc f="\u00df" 1\n'
    res = handled(body)
    for other in (body.encode(), bytearray(body.encode()), memoryview(body.encode())):
        assert_same(lp._parse_c(other, "ns", DEFAULT_TIME), res)
        assert_same(parse_lines(other, "ns", DEFAULT_TIME), res)
    with pytest.raises(TypeError):
        parse_lines(object(), "ns", DEFAULT_TIME)  # the Python path's error
    assert lp._parse_c(12345, "ns", DEFAULT_TIME) is None  # bytes(12345): 12345 NULs, a bad line
    assert_same(parse_lines(12345, "ns", DEFAULT_TIME), lp._parse(12345, "ns", DEFAULT_TIME, fast=False))
    assert handled(b"").tables == {} and handled("\n\n# x\r\n  \r\n").lines == 0


def test_default_time_and_precision():
    with pytest.raises(ValueError):
        parse_lines(b"m f=1", "d")
    assert lp._parse_c(b"m f=1", "d") is None
    for p, mult in (("ns", 1), ("us", 1_000), ("ms", 1_000_000), ("s", 1_000_000_000), ("m", 60_000_000_000),
                    ("h", 3_600_000_000_000)):
        res = handled(f"m f=1\nm f=2 3\nm f=3 -{I64_MAX // mult}", p, 42)
        assert res.tables["m"].data.column("time").to_pylist() == [42, 3 * mult, -(I64_MAX // mult) * mult]
    assert lp._parse_c(b"m f=1", "ns", 1 << 63) is None  # out of int64: the Python path decides
    assert lp._parse_c(b"m f=1", "ns", None).tables["m"].data.column("time")[0].as_py() > 1_600_000_000 * 10**9


# --------------------------------------------------------------------------
# differential: the shared vectors and hypothesis bodies
# --------------------------------------------------------------------------

@pytest.mark.parametrize("case", base.CASES, ids=[c["id"] for c in base.CASES])
def test_vector_c_path(case):
    body, precision = case["line"], case.get("precision", "ns")
    c = differential(body, precision)
    if case.get("kind") != "batch" and _valid_utf8(body):
        assert (c is not None) == case["ok"], case
    differential(body.encode("utf-8", "surrogatepass"), precision)


@HYPOTHESIS
@given(base.documents())
def test_documents_are_handled_by_c(doc):
    precision, body, points = doc
    res = handled(body, precision)
    assert res.lines == len(points)
    res = handled(body.encode(), precision)


@HYPOTHESIS
@given(base.documents(), st.integers(1, 40))
def test_repeated_documents_are_handled_by_c(doc, times):
    """Many rows: buffer growth, null bitmaps across bytes, columns that appear late."""
    precision, body, _ = doc
    handled(body * times, precision)


@HYPOTHESIS
@given(base.shaped_bodies())
def test_shaped_bodies_c_path(doc):
    precision, body = doc
    differential(body, precision)


@HYPOTHESIS
@given(base.documents(), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 2), base._MUTATION_CHARS),
                                  min_size=1, max_size=6))
def test_mutated_documents_c_path(doc, mutations):
    precision, body, _ = doc
    chars = list(body * 2)
    for pos, op, c in mutations:
        pos %= len(chars) + 1
        if op == 0:
            chars.insert(pos, c)
        elif op == 1 and pos < len(chars):
            del chars[pos]
        elif pos < len(chars):
            chars[pos] = c
    differential("".join(chars), precision)


@HYPOTHESIS
@given(st.one_of(st.binary(max_size=300),
                 st.text(alphabet=st.sampled_from(list('mft ,="\\\n\r#0123456789.eEiu-\t') + ["\x00", "\u00e9"]),
                         max_size=300)))
def test_arbitrary_input_c_path(data):
    differential(data)


# --------------------------------------------------------------------------
# values: floats, integers, timestamps, strings, booleans
# --------------------------------------------------------------------------

_FLOAT_TEXT = st.from_regex(r"\A-?[0-9]{1,25}(\.[0-9]{1,25})?([eE][+-]?[0-9]{1,4})?\Z")


def _c_float(text: str) -> float:
    res = lp._parse_c(f"m f={text}", "ns", DEFAULT_TIME)
    assert res is not None, text
    return res.tables["m"].data.column("f")[0].as_py()


@settings(max_examples=2000, deadline=None)
@given(_FLOAT_TEXT)
def test_float_conversion_is_pythons(text):
    assert struct.pack("<d", _c_float(text)) == struct.pack("<d", float(text)), text


@pytest.mark.parametrize("text", [
    "9007199254740992", "9007199254740993", "9007199254740995", "-9007199254740993", "1e22", "1e23", "1e-22",
    "1e-23", "123456789012345678901234567890", "0.1", "0.3", "2.2250738585072014e-308", "4.9e-324", "5e-325",
    "1.7976931348623157e308", "1.7976931348623159e308", "-0", "-0.0e5", "0e999999", "1e999999", "-1e999999",
    "1e-999999", "10000000000000000000000", "0.000000000000000000000001", "1" + "0" * 30 + "e-30",
    "4503599627370497.5", "12.345", "67.89", "100", "1.00000000000000000E+00", "0" * 5000 + "1.5",
    "1e" + "0" * 5000 + "2", "9" * 400 + "." + "9" * 400,
    # just past the exact fast path (10^23): two roundings would differ from one
    "5872980113096234e23", "2243269765354357e23", "1412794706651708e23", "118706e-23", "106928e-23",
    "5872980113096234e22", "58729801130962340e22", "587298011309623.4e24",
])
def test_float_corner_cases(text):
    assert struct.pack("<d", _c_float(text)) == struct.pack("<d", float(text)), text
    handled(f"m f={text},g=1i {len(text)}")


@pytest.mark.parametrize("body,value", [
    ("m f=1e400,f=2.5", 2.5),  # a value left to Python's conversion, then overridden
    ("m f=2.5,f=1e400", math.inf),
    ("m f=1e-400,f=1e400", math.inf),
    ("m f=1e400,g=1i,f=5e-324", 5e-324),
    ("m f=1e400,f=1e400,f=7", 7.0),
])
def test_repeated_float_fields(body, value):
    assert handled(body).tables["m"].data.column("f").to_pylist() == [value]


def test_integers_and_timestamps_of_every_length():
    lines = []
    for n in range(1, 21):
        d = "12345678901234567890"[:n]  # 19 digits fit int64, 20 uint64
        i = d[:19]
        lines.append(f"m i={i}i,u={d}u,z=000{d}u {i}")
        lines.append(f"m i=-{i}i,u=0{d}u -{i}")
    lines += [f"m i={I64_MIN}i,u={U64_MAX}u {I64_MIN}", f"m i={I64_MAX}i,u=0u {I64_MAX}",
              "m i=-0i,u=00000000000000000000000000u -0", "m i=" + "0" * 40 + "1i 00000000000000000000000000000001"]
    handled("\n".join(lines))
    for bad in (f"m i={I64_MAX + 1}i", f"m i={I64_MIN - 1}i", f"m u={U64_MAX + 1}u", "m u=-1u",
                f"m f=1 {I64_MAX + 1}", f"m f=1 {I64_MIN - 1}", "m u=" + "9" * 20 + "u", "m u=" + "1" * 21 + "u"):
        fell_back(bad)


def test_strings_and_limits():
    big = "a" * 65536
    handled(f'm s="{big}",t="{big[:-1]}\\\\" 1\nm s="" 2\nm,k={big} f=1\n{big} f=1\nm {big}=1')
    fell_back(f'm s="{big}a"')
    fell_back(f'm s="{big[:-1]}\\\\a"')  # 64 KiB + 1 once unescaped
    handled(f'm s="{big[:-1]}\\\\"')  # exactly 64 KiB once unescaped
    fell_back(f"m,k={big}a f=1")
    fell_back(f"m,k={big[:-1]}\\\\\\\\ f=1")  # ends with a backslash
    handled(f"m,k={big[:-2]}\\ \\, f=1")
    for s in ('"a\\"', '"a\\\\"', '"\\"\\""', '"\\\\\\""', '"x\\y"', '"\\', '"\\"', '"\n"', '"a" ', '"a"b'):
        differential(f"m s={s}")
        differential(f"m s={s} 1\nm s=\"ok\" 2")


@pytest.mark.parametrize("text", ["t", "T", "true", "True", "TRUE", "f", "F", "false", "False", "FALSE",
                                  "tr", "tRUE", "TRue", "fa", "FALSe", "truex", "t1", "yes"])
def test_booleans(text):
    differential(f"m b={text}")
    differential(f"m b={text},c=1 5")
    differential(f"m b={text} 5")


# --------------------------------------------------------------------------
# scanning: names of every length at the end of the body and before other lines (SIMD blocks)
# --------------------------------------------------------------------------

@pytest.mark.parametrize("n", list(range(1, 40)))
def test_names_of_every_length(n):
    name = "".join("abcdefghijklmnopqrstuvwxyz0123456789_-."[i % 39] for i in range(n))
    esc = name[: n // 2] + "\\ " + name[n // 2:]
    for line in (f"{name},{name}x={name} {name}y={n}i {n}", f"{name} {name}=1",
                 f"{esc},{esc}={esc} {esc}f=\"{name}\"", f"{name},t={name} f=1.{name.count('a')}",
                 f"m f={'1' * n},g={'2' * min(n, 19)}i,h={'3' * min(n, 19)}u {'4' * min(n, 18)}"):
        handled(line)
        handled(line + "\n")
        handled(line + "\r\n" + line)
        handled(line + "\n" + "x" * 40 + " f=1")
        differential(line + "\tz")
        differential(line + "\x00")


_LONG = "1234567890123456"
_BYTE_TEMPLATES = [  # <> is the byte; short ones end in the scalar scan, long ones in the SIMD scan
    "m<>x f=1", "m,t<>k=v f=1", "m,t=v<>w f=1", "m k<>y=1", "m f=<>1", "m f=-<>1", "m f=12<>", "m f=12i<>",
    "m f=12u<>", "m f=1.5<>", "m f=1.<>5", "m f=1e5<>", "m f=1e<>5", "m f=1 12<>", "m f=1 -<>12", "m f=1 12 <>",
    "m f=t<>", "m f=true<>", 'm f="s<>"', "m f=1,<>g=2", "measurement<>x f=1", "m,tag=value" + _LONG + "<>x f=1",
    "m f=" + _LONG + "<>", "m f=" + _LONG + "i<>", "m f=1 " + _LONG + "<>", "m " + _LONG + "k<>=1",
]


@pytest.mark.parametrize("b", [chr(i) for i in range(128)] + ["\u00e9", "\u20ac", "\U0001f680"],
                         ids=[f"{i:02x}" for i in range(128)] + ["e9", "20ac", "1f680"])
def test_every_byte_at_every_position(b):
    for t in _BYTE_TEMPLATES:
        line = t.replace("<>", b)
        differential(line)
        differential(line + "\n" + "z" * 20 + " f=1 " + _LONG)


_SPLIT_CASES = [
    'a s="\\""', 'a s="x\\\\"', 'a s="\\\\\\""', 'a s="a\nb"', 'a\\\nb f=1', 'a,t="x f=1', ' a=,t="x f=1',
    'a a,b="x=y" 1', '# c="x', '# c="x"', 'a s="\\"\n"', 'a s="x",t="y\\\\"', 'a\\\\ f=1', "a f=1\\", 'a s="\r\n"',
    'a s="," 1', 'a,t=\\" s="=" 1',
]


@pytest.mark.parametrize("case", _SPLIT_CASES)
def test_line_splitting_at_every_alignment(case):
    """The splitter scans 16 bytes at a time from each line's start and byte by byte in the body's
    last 15: each quoting case at every offset, before another line, at the body's end."""
    for pad in range(18):
        before = ("x" * pad + " f=1\n") if pad else ""
        for after in ("", "\nb f=1", "\nb f=1\n", '\nb s="q"', "\r\n" + "c" * pad + " f=2"):
            differential(before + case + after)


def test_stop_bytes_past_the_line_end_are_not_seen():
    # the SIMD scan reads past the line's end (into the next one): a stop byte there must not end
    # a run early, nor may a missing stop end a line's run late
    handled("m,t=abc f=1\nmeasurement,tag=value field=1")
    differential("m,t=abcdefgh f=1i 123\r\n,=\\ \t\n")
    differential("m,t=abc f=1 12345678\n9")
    handled("m f=1 12345678\n9 f=1")
    handled("m f=1 1234567812345678\r\n" + "x" * 30 + " f=1")
    handled("m s=\"abc\" 1\n\"quoted\" f=1")


# --------------------------------------------------------------------------
# tables, columns, nulls
# --------------------------------------------------------------------------

@st.composite
def sparse_bodies(draw):
    """Several tables, columns that appear and disappear, many rows (bitmaps, buffer growth).

    The column types and the number of lines are hypothesis draws; each line's shape comes from a
    seeded `random.Random` (one draw): ~15 hypothesis draws per line made generating the 200
    bodies take ~20 s, the parsing and comparing ~1 s."""
    types = {f"c{i}": draw(st.sampled_from(base._FIELD_TYPES)) for i in range(6)}
    n_lines = draw(st.integers(1, 300))
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    lines = []
    for i in range(n_lines):
        meas = rnd.choice("abc")
        tags = [f"t{j}=v{rnd.randint(0, 3)}" for j in range(4) if rnd.random() < 0.5]
        rnd.shuffle(tags)
        keys = [k for k in types if rnd.randint(0, 3) == 0] or ["c0"]
        vals = {"float": "1.5", "integer": f"{i}i", "uinteger": f"{i}u", "string": f'"s{i}"', "boolean": "tT"[i % 2]}
        fields = ",".join(f"{k}={vals[types[k]]}" for k in keys)
        ts = rnd.choice(["", f" {i}", f" {i % 7}"])
        lines.append(meas + "".join("," + t for t in tags) + " " + fields + ts)
    return "\n".join(lines)


@HYPOTHESIS
@given(sparse_bodies())
def test_sparse_tables(body):
    handled(body)


def test_column_order_and_types():
    res = handled('t,b=1,a=2,\u00e9=3,B=4 z=1,y=2i,x=3u,w="s",v=t,\u00e0=1.5,Z=2 1')
    assert res.tables["t"].columns == [
        ColumnSpec("B", "tag", "string"), ColumnSpec("a", "tag", "string"), ColumnSpec("b", "tag", "string"),
        ColumnSpec("\u00e9", "tag", "string"),
        ColumnSpec("Z", "field", "float"), ColumnSpec("v", "field", "boolean"), ColumnSpec("w", "field", "string"),
        ColumnSpec("x", "field", "uinteger"), ColumnSpec("y", "field", "integer"), ColumnSpec("z", "field", "float"),
        ColumnSpec("\u00e0", "field", "float"), ColumnSpec("time", "time", "time")]
    assert [f.type for f in res.tables["t"].data.schema] == [
        pa.string()] * 4 + [pa.float64(), pa.bool_(), pa.string(), pa.uint64(), pa.int64(), pa.float64(),
                             pa.float64(), pa.int64()]


def test_many_tables_and_columns():
    lines = [f"t{i % 300},k{i % 50}=v f{i % 700}={i}i,g=1 {i}" for i in range(3000)]
    res = handled("\n".join(lines))
    assert len(res.tables) == 300 and res.lines == 3000


def test_a_large_body(monkeypatch):
    lines = [f'cpu,host=h{i % 1000},dc=d{i % 7} u={i}.5,s="x{i}",n={i}i {i}' for i in range(300_000)]
    body = ("\n".join(lines)).encode()  # 19 MB
    res = lp._parse_c(body, "ns", DEFAULT_TIME)
    assert res is not None and res.lines == 300_000
    tb = res.tables["cpu"]
    assert tb.unique_keys is True
    assert tb.data.column("s")[299_999].as_py() == "x299999"
    assert tb.data.column("u")[12345].as_py() == 12345.5
    monkeypatch.setattr(lp, "_lpfast", None)  # the Python path (its fast path: the full parser is slow here)
    assert_same(res, parse_lines(body, "ns", DEFAULT_TIME))


def test_threads_get_the_same_results():
    body = "\n".join(f'm,t=a{i % 10} f={i}.25,s="{i}" {i}' for i in range(20_000)).encode()
    want = lp._parse_c(body, "ns", DEFAULT_TIME)
    results = []

    def work():
        for _ in range(5):
            results.append(lp._parse_c(body, "ns", DEFAULT_TIME))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 20
    for r in results:
        assert_same(r, want)


# --------------------------------------------------------------------------
# unique_keys
# --------------------------------------------------------------------------

def _unique(body, precision="ns", default_time=DEFAULT_TIME):
    return {name: tb.unique_keys for name, tb in handled(body, precision, default_time).tables.items()}


def test_unique_keys_tag_order_does_not_matter():
    assert _unique("m,a=1,b=2 f=1 10\nm,b=2,a=1 f=2 10") == {"m": False}
    assert _unique("m,a=1,b=2 f=1 10\nm,b=2,a=1 f=2 11") == {"m": True}


def test_unique_keys_series_and_time():
    assert _unique("m,a=1 f=1 10\nm,a=2 f=1 10") == {"m": True}  # same time, other series
    assert _unique("m,a=1 f=1 10\nm,a=1 f=1 11") == {"m": True}  # same series, other time
    assert _unique("m,a=1 f=1 10\nm,a=1 g=1 10") == {"m": False}  # other fields do not matter
    assert _unique("m f=1 1\nm f=2 2") == {"m": True}
    assert _unique("m f=1 1\nm g=2 1") == {"m": False}  # no tags at all: the time alone


def test_unique_keys_a_missing_tag_is_a_different_series():
    assert _unique("m,a=1 f=1 10\nm f=1 10") == {"m": True}
    assert _unique("m,a=1 f=1 10\nm,a=1,b=2 f=1 10") == {"m": True}
    assert _unique("m,a=1 f=1 10\nm,b=1 f=1 10") == {"m": True}  # same value, other key
    assert _unique("m,a=1 f=1 10\nm,b=2 f=1 10\nm f=1 10\nm,b=2 g=1 10") == {"m": False}


def test_unique_keys_interleaved_tables():
    body = "m,a=1 f=1 10\nn,a=1 f=1 10\nm,a=2 f=1 10\nn,a=2 f=1 10\nm,a=1 g=2 10"
    assert _unique(body) == {"m": False, "n": True}
    assert _unique(body.replace("m,a=1 g=2 10", "n,a=2 g=2 10")) == {"m": True, "n": False}


def test_unique_keys_default_time_escapes_and_precision():
    assert _unique("m,a=1 f=1\nm,a=1 f=2") == {"m": False}  # both get the default time
    assert _unique("m,a=1 f=1 5\nm,a=1 f=2", default_time=5) == {"m": False}
    assert _unique("m,a=1 f=1 5\nm,a=1 f=2", default_time=6) == {"m": True}
    assert _unique("m,t=a\\ b f=1 1\nm,t=a\\ b f=2 1") == {"m": False}
    assert _unique("m,t\\,k=v f=1 1\nm,t\\,k=v f=2 1") == {"m": False}
    assert _unique("m f=1 1\nm f=2 1000", "us") == {"m": True}
    assert _unique("m f=1 1000000\nm f=2 1000", "ns") == {"m": True}
    assert _unique("m f=1 1\nm f=2 1", "s") == {"m": False}
    assert _unique("m f=1 1000\nm f=2", "us", default_time=10**6) == {"m": False}  # the default is ns


def test_unique_keys_is_unknown_on_the_python_path_and_not_part_of_equality():
    body = "m,a=1 f=1 10\nm,a=1 f=2 10"
    assert lp._parse(body, "ns", DEFAULT_TIME, fast=False).tables["m"].unique_keys is None
    bad = body + "\nbad"
    assert all(tb.unique_keys is None for tb in parse_lines(bad, "ns", DEFAULT_TIME).tables.values())
    c = lp._parse_c(body, "ns", DEFAULT_TIME).tables["m"]
    py = lp._parse(body, "ns", DEFAULT_TIME, fast=False).tables["m"]
    assert c.unique_keys is False and py.unique_keys is None
    assert c == py
    assert TableBatch("m", [], pa.table({}), True) == TableBatch("m", [], pa.table({}))


@HYPOTHESIS
@given(st.lists(st.tuples(st.sampled_from(["m", "n"]), st.permutations(["a=1", "b=2", "c=1"]), st.integers(0, 3),
                          st.sampled_from(["", " 1", " 2"])), min_size=1, max_size=30))
def test_unique_keys_against_a_model(lines):
    body = "\n".join(m + "".join("," + t for t in tags[:k]) + " f=1" + ts for m, tags, k, ts in lines)
    seen: dict[str, list] = {}
    for m, tags, k, ts in lines:
        seen.setdefault(m, []).append((frozenset(tags[:k]), ts or str(DEFAULT_TIME)))
    assert _unique(body) == {m: len(set(keys)) == len(keys) for m, keys in seen.items()}
