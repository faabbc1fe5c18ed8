"""--role: what a server refuses before doing anything (a querier claims nothing, an ingester
answers no user query). Nothing is started: the refusal comes first."""
from __future__ import annotations

import pytest

from iox_spark.server.errors import RoleRefuses


def test_a_querier_claims_no_partition():
    from iox_spark.server.pool.membership import claims_of

    # before the pool is asked anything (none is given)
    with pytest.raises(RoleRefuses, match="role is querier: it does not claim partitions") as info:
        claims_of(None, "querier")("db", [0])
    assert (info.value.role, info.value.what) == ("querier", "claim partitions")


def test_a_server_outside_a_pool_claims_no_partition():
    from iox_spark.server.errors import NotAPoolMember
    from iox_spark.server.pool.membership import claims_of

    with pytest.raises(NotAPoolMember):
        claims_of(None, "all")("db", [0])


def test_an_ingester_answers_no_user_query():
    from iox_spark.server.query_service import QueryService

    # before the read barrier, the pool or the engine is asked anything (none is given)
    with pytest.raises(RoleRefuses, match="role is ingester: it does not answer queries"):
        QueryService("ingester", None, None, None, None).query("db", "SELECT 1")
