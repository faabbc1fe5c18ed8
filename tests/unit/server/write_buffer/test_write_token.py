"""Write tokens (server/write_buffer/write_token.py): the printable form round-trips, anything else is refused
with a reason."""
from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given, strategies as st

from iox_spark.server.errors import InvalidArgument
from iox_spark.server.write_buffer.write_token import (TOKEN_PREFIX, InvalidWriteToken, WriteToken, WriteTokenVersionMismatch,
                                             format_token, merge_offsets, parse_token)

tokens = st.builds(WriteToken, topic=st.text(min_size=1, max_size=40), topic_id=st.none() | st.text(max_size=30),
                   epoch=st.integers(0, 2**40),
                   offsets=st.dictionaries(st.integers(0, 4095), st.integers(0, 2**62), max_size=8))


@given(tokens)
def test_the_printable_form_round_trips_and_is_one_plain_word(t):
    text = format_token(t)
    assert parse_token(text) == t
    assert parse_token(f"  {text}\n") == t  # as copied from a terminal
    assert text.startswith(TOKEN_PREFIX) and all(c.isalnum() or c in "-_." for c in text)


def _body(obj) -> str:
    return TOKEN_PREFIX + base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")


@pytest.mark.parametrize("text,reason", [
    ("", "does not start"),
    ('{"0": 5}', "does not start"),
    ("wt1.!!!", "base64url"),
    (_body([1, 2]), "not a JSON object"),
    (_body({"topic": "", "epoch": 0, "offsets": {}}), "names no topic"),
    (_body({"topic": "t", "epoch": -1, "offsets": {}}), "epoch"),
    (_body({"topic": "t", "epoch": True, "offsets": {}}), "epoch"),
    (_body({"topic": "t", "epoch": 0, "offsets": {"x": 1}}), "offset 'x'"),
    (_body({"topic": "t", "epoch": 0, "offsets": {"0": -3}}), "offset '0'"),
    (_body({"topic": "t", "epoch": 0, "offsets": {"0": 1.5}}), "offset '0'"),
    (_body({"topic": "t", "topic_id": 7, "epoch": 0, "offsets": {}}), "topic_id"),
])
def test_anything_else_is_an_invalid_argument_naming_the_problem(text, reason):
    with pytest.raises(InvalidWriteToken, match=reason) as e:
        parse_token(text)
    assert isinstance(e.value, InvalidArgument)


def test_another_version_is_refused_by_name():
    text = "wt9." + format_token(WriteToken("t", None, 0, {0: 1}))[len(TOKEN_PREFIX):]
    with pytest.raises(WriteTokenVersionMismatch, match="'wt9.'"):
        parse_token(text)


def test_merge_keeps_the_highest_offset_per_partition():
    assert merge_offsets({0: 5, 1: 9}, {1: 3, 2: 0}) == {0: 5, 1: 9, 2: 0}
