"""ServerConfig validation and how `iox serve` reports a bad value."""
import pytest

from server.cli import main
from server.config import InvalidConfig, ServerConfig


def test_txn_timeout_must_leave_room_for_the_router_to_give_up_first():
    with pytest.raises(InvalidConfig) as ei:
        ServerConfig(txn_timeout_s=20.0, produce_timeout_ms=10_000)
    assert ei.value.field == "txn_timeout_s" and ei.value.actual == 20.0
    assert "25 s" in str(ei.value)
    assert ServerConfig(txn_timeout_s=8.0, produce_timeout_ms=1_000).txn_timeout_s == 8.0


def test_serve_rejects_a_too_short_txn_timeout_as_a_usage_error(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["serve", "--txn-timeout-s", "5"])
    assert ei.value.code == 2
    assert "--txn-timeout-s" in capsys.readouterr().err
