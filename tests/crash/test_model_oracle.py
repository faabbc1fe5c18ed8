"""The model tests' oracle (tests/crash/model.py) across checks: pure, no process."""
from __future__ import annotations

import pytest

from tests.crash.model import LogOp, Request, check_requests


def _delete_op(offset: int) -> LogOp:
    return LogOp(kp=0, offset=offset, table="m", rows=None, rid=None, delete=("m", 6, 11, None),
                 message_offset=offset)


def _write_op(offset: int, rid: int) -> LogOp:
    return LogOp(kp=0, offset=offset, table="m", rows=(("a", 1, {"v": 1, "r": rid}),), rid=rid, delete=None,
                 message_offset=offset)


def test_a_delete_that_landed_is_matched_again_at_the_next_check():
    landed = Request(rid=1, delete=("m", 6, 11, None))  # its answer was lost
    check_requests([landed], [_delete_op(3)])
    assert (landed.state, landed.token) == ("landed", {0: 3})
    same = Request(rid=2, delete=("m", 6, 11, None), state="acked", token={0: 5})
    ops = [_delete_op(3), _delete_op(5)]
    check_requests([landed, same], ops)
    check_requests([landed, same], ops)
    assert (landed.state, same.state) == ("landed", "acked")


def test_a_request_that_landed_never_leaves_the_write_buffer():
    landed = Request(rid=1, delete=("m", 6, 11, None))
    check_requests([landed], [_delete_op(3)])
    with pytest.raises(AssertionError, match="no longer there"):
        check_requests([landed], [])


def test_a_request_found_lost_never_lands_later():
    lost = Request(rid=1, points=[("m", "a", 1, {"v": 1})])
    check_requests([lost], [])
    assert lost.state == "lost"
    with pytest.raises(AssertionError, match="found missing before"):
        check_requests([lost], [_write_op(0, 1)])


def test_a_delete_applied_twice_fails():
    acked = Request(rid=1, delete=("m", 6, 11, None), state="acked", token={0: 3})
    with pytest.raises(AssertionError, match="applied twice"):
        check_requests([acked], [_delete_op(3), _delete_op(4)])
