"""Reading what a server published as Iceberg, with the readers users have: pyiceberg and DuckDB
(its Iceberg extension, installed from PyPI with its Avro dependency, loaded from the wheels)."""
from __future__ import annotations

import glob
import os

from iox_spark.lifecycle.iceberg_publication import CATALOG_NAME, REVISION_PROPERTY, SQLITE_FILE

__all__ = ["sqlite_catalog", "iceberg_table", "published_revisions", "pyiceberg_rows", "duckdb", "duckdb_rows"]


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


def duckdb():
    """A DuckDB connection with the Iceberg extension loaded."""
    import duckdb as _duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    con = _duckdb.connect(config={"autoinstall_known_extensions": "false", "autoload_known_extensions": "false"})
    for mod, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
        (path,) = glob.glob(os.path.join(os.path.dirname(mod.__file__), "extensions", "*", f"{name}.duckdb_extension"))
        con.execute(f"LOAD '{path}'")
    return con


def duckdb_rows(tbl, columns: tuple) -> list[tuple]:
    """The rows DuckDB reads from `tbl`'s current metadata, as tuples of `columns`, sorted."""
    cols = ", ".join(f'"{c}"' for c in columns)
    rows = duckdb().execute(f"SELECT {cols} FROM iceberg_scan('{tbl.metadata_location}')").fetchall()
    return sorted((tuple(r) for r in rows), key=repr)
