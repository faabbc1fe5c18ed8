"""Reading what a server published as Iceberg, with the readers users have: pyiceberg and DuckDB
(its Iceberg extension, installed from PyPI with its Avro dependency, loaded from the wheels)."""
from __future__ import annotations

import glob
import os

from iox_spark.lifecycle.iceberg_publication import CATALOG_NAME, REVISION_PROPERTY, SQLITE_FILE

__all__ = ["wait_published", "sqlite_catalog", "iceberg_table", "published_revisions", "pyiceberg_rows", "duckdb", "duckdb_rows", "server_table"]


def wait_published(server, db: str, timeout_s: float = 60.0) -> int:
    """Waits until the in-process `server` published its newest catalog revision of `db` to Iceberg
    (and so knows which files its snapshots reference); returns the revision."""
    from tests.waiting import wait_for

    revision = server.lifecycle.preserved[db].revision
    wait_for(lambda: (server.iceberg.publisher.published_revision(db) or -1) >= revision, timeout_s,
             f"Iceberg publishing revision {revision} of {db}")
    return revision


def sqlite_catalog(data_dir: str):
    """The default Iceberg catalog of a server on `data_dir`, as a user loads it."""
    from pyiceberg.catalog import load_catalog

    return load_catalog(CATALOG_NAME, type="sql", uri=f"sqlite:///{os.path.join(data_dir, SQLITE_FILE)}")


def iceberg_table(data_dir: str, db: str, table: str):
    """The Iceberg table, None while it does not exist."""
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    try:
        return sqlite_catalog(data_dir).load_table((db, table))
    except (NoSuchTableError, NoSuchNamespaceError):
        return None


def published_revisions(tbl) -> list[int]:
    """The catalog revision of each snapshot of `tbl`, oldest first ([] for None)."""
    if tbl is None:
        return []
    return [int(s.summary.additional_properties[REVISION_PROPERTY]) for s in tbl.snapshots()]


def pyiceberg_rows(tbl, columns: tuple) -> list[tuple]:
    """The rows of `tbl`'s current snapshot, as tuples of `columns`, sorted."""
    t = tbl.scan(selected_fields=columns).to_arrow()
    return sorted((tuple(r[c] for c in columns) for r in t.to_pylist()), key=repr)


def duckdb(s3_endpoint: str | None = None):
    """A DuckDB connection with the Iceberg extension loaded (and, for an S3 endpoint such as
    moto_server's, httpfs with the test credentials)."""
    import duckdb as _duckdb
    import duckdb_extension_avro
    import duckdb_extension_httpfs
    import duckdb_extension_iceberg

    con = _duckdb.connect(config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"})
    for mod, name in ((duckdb_extension_httpfs, "httpfs"), (duckdb_extension_avro, "avro"),
                      (duckdb_extension_iceberg, "iceberg")):
        (path,) = glob.glob(os.path.join(os.path.dirname(mod.__file__), "extensions", "*", f"{name}.duckdb_extension"))
        con.execute(f"LOAD '{path}'")
    if s3_endpoint is not None:
        from urllib.parse import urlsplit

        con.execute(f"CREATE SECRET (TYPE s3, KEY_ID 'test', SECRET 'test', REGION 'us-east-1', URL_STYLE 'path', "
                    f"ENDPOINT '{urlsplit(s3_endpoint).netloc}', USE_SSL false)")
    return con


def duckdb_rows(tbl, columns: tuple, s3_endpoint: str | None = None) -> list[tuple]:
    """The rows DuckDB reads from `tbl`'s current metadata, as tuples of `columns`, sorted."""
    cols = ", ".join(f'"{c}"' for c in columns)
    rows = duckdb(s3_endpoint).execute(f"SELECT {cols} FROM iceberg_scan('{tbl.metadata_location}')").fetchall()
    return sorted((tuple(r) for r in rows), key=repr)


def server_table(server, db: str, table: str):
    """The Iceberg table an in-process `server` publishes `table` of `db` to, read from its catalog
    as a user would (the catalog's properties: its URI and the object store's S3 settings)."""
    from pyiceberg.catalog import load_catalog

    from iox_spark.lifecycle.iceberg_publication import catalog_properties

    props = catalog_properties(server.config.iceberg_catalog, server.config.abs_data_dir, server.store,
                               pool=server.config.pool_member is not None)
    return load_catalog(CATALOG_NAME, **props).load_table((db, table))
