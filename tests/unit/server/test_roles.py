"""--role: what a server refuses before doing anything (a querier claims nothing, an ingester
answers no user query). Nothing is started: the refusal comes first."""
from __future__ import annotations

import pytest

from iox_spark.server.config import ServerConfig
from iox_spark.server.errors import RoleRefuses


def _server(role: str):
    from iox_spark.server.app import IoxServer

    return IoxServer(ServerConfig(pool_member="m", role=role))


def test_a_querier_claims_no_partition():
    with pytest.raises(RoleRefuses, match="role is querier: it does not claim partitions") as info:
        _server("querier").claim_partitions("db", [0])
    assert (info.value.role, info.value.what) == ("querier", "claim partitions")


def test_an_ingester_answers_no_user_query():
    from iox_spark.server.query_service import QueryService

    # before the read barrier, the pool or the engine is asked anything (none is given)
    with pytest.raises(RoleRefuses, match="role is ingester: it does not answer queries"):
        QueryService("ingester", None, None, None, None).query("db", "SELECT 1")
