"""server/api/client.py: responses as dicts with 64-bit integers as ints (no server here)."""
from __future__ import annotations

from iox_spark.iox import management_pb2, query_pb2

from iox_spark.server.api.client import as_dict


def test_int64_fields_are_ints_at_every_depth():
    r = management_pb2.GetStatusResponse(databases=[management_pb2.DatabaseStatus(
        name="db", catalog_revision=7,
        write_buffer=[management_pb2.KafkaPartitionStatus(partition=1, applied_hi_inclusive=-1,
                                                          visible_hi_inclusive=2**62)])])
    d = as_dict(r)
    db = d["databases"][0]
    assert db["catalog_revision"] == 7 and db["name"] == "db"
    assert db["write_buffer"][0]["applied_hi_inclusive"] == -1
    assert db["write_buffer"][0]["visible_hi_inclusive"] == 2**62
    assert db["write_buffer"][0]["partition"] == 1


def test_map_values_of_int64_are_ints():
    r = query_pb2.QueryResponse()
    r.applied_hi_inclusive[0] = 5
    r.applied_hi_inclusive[3] = 2**40
    assert as_dict(r)["applied_hi_inclusive"] == {"0": 5, "3": 2**40}
