"""The errors of the Spark data source: one root, one class per cause, structured fields.

Invariant: every failure the data source can explain raises a subclass of
:class:`IoxSourceError` naming what to change; failures of the object store or of
the catalog's files are chained as the cause (``raise ... from``). Raised on the
driver while a read is loaded and planned (options, snapshot, schema, deletes);
Spark reports them as the failure of ``load()`` with this message. Only
:class:`FileGone` is raised on an executor, failing the Spark job.
"""
from __future__ import annotations

__all__ = ["IoxSourceError", "InvalidOption", "AssignerNotAvailable", "DatabaseNotFound", "TableNotFound",
           "RevisionNotFound", "CatalogUnreadable", "SchemaMismatch", "UnsupportedDelete", "FileGone",
           "OwnerUnavailable"]


class IoxSourceError(Exception):
    """Root of the data source's errors."""


class InvalidOption(IoxSourceError, ValueError):
    """An option is missing, unknown or malformed."""

    def __init__(self, option: str, reason: str):
        self.option = option
        self.reason = reason
        super().__init__(f"iox data source option {option!r}: {reason}")


class AssignerNotAvailable(IoxSourceError):
    """The `assigner` option asks for the owners' unpersisted rows, which this version cannot read."""

    def __init__(self, assigner: str):
        self.assigner = assigner
        super().__init__(f"iox data source option 'assigner' ({assigner!r}): the assigner serves no reads; to add "
                         "the ingester pool's unpersisted rows use .option('unpersisted', 'true') (the owners are "
                         "found through the object store)")


class DatabaseNotFound(IoxSourceError):
    """The object store holds no preserved catalog for the database."""

    def __init__(self, object_store: str, database: str):
        self.object_store = object_store
        self.database = database
        super().__init__(f"database {database!r} has no preserved catalog in object store {object_store}: "
                         "check the object_store and database options (a database's catalog is written "
                         "when the server creates it)")


class TableNotFound(IoxSourceError):
    """The database's catalog snapshot has no schema for the table (nothing of it was persisted)."""

    def __init__(self, database: str, table: str, revision: int, tables: list):
        self.database = database
        self.table = table
        self.revision = revision
        self.tables = list(tables)
        known = ", ".join(repr(t) for t in self.tables) or "none"
        super().__init__(f"table {table!r} of database {database!r} has nothing persisted as of catalog revision "
                         f"{revision} (persisted tables: {known})")


class RevisionNotFound(IoxSourceError):
    """The `revision` option names a revision the catalog has not committed."""

    def __init__(self, database: str, revision: int, newest: int):
        self.database = database
        self.revision = revision
        self.newest = newest
        super().__init__(f"database {database!r} has no catalog revision {revision}: its newest is {newest}")


class CatalogUnreadable(IoxSourceError):
    """The preserved catalog could not be read (a newer format, a broken chain, a corrupt file);
    the catalog's own error is the cause."""

    def __init__(self, database: str, reason: str):
        self.database = database
        self.reason = reason
        super().__init__(f"preserved catalog of database {database!r} cannot be read: {reason}")


class SchemaMismatch(IoxSourceError):
    """A schema given with `.schema(...)` differs from the table's."""

    def __init__(self, table: str, expected: str, given: str):
        self.table = table
        self.expected = expected
        self.given = given
        super().__init__(f"table {table!r} has schema {expected}; the schema given is {given} "
                         "(leave out .schema(...) to use the table's)")


class UnsupportedDelete(IoxSourceError):
    """A recorded delete predicate compares a column in a way the reader does not evaluate."""

    def __init__(self, table: str, terms: tuple):
        self.table = table
        self.terms = terms
        super().__init__(f"table {table!r}: a recorded delete ({terms!r}) compares a column this reader "
                         "cannot evaluate; the rows are not returned rather than returned undeleted")


class FileGone(IoxSourceError):
    """A file the snapshot names is no longer in the object store: the revision read is old
    enough that compaction replaced the file and cleanup deleted it."""

    def __init__(self, key: str, database: str, revision: int):
        self.key = key
        self.database = database
        self.revision = revision
        super().__init__(f"file {key} of database {database!r} at catalog revision {revision} is no longer in "
                         "the object store (cleanup deletes files no newer revision names): load() again to "
                         "read the newest revision")


class OwnerUnavailable(IoxSourceError):
    """A read with ``unpersisted`` = true needs the unpersisted rows of the pool member that owns the
    table's Kafka partition, and that member does not answer (or published no address)."""

    def __init__(self, database: str, table: str, owner: str, reason: str):
        self.database, self.table, self.owner, self.reason = database, table, owner, reason
        super().__init__(f"database {database!r} table {table!r}: its owner {owner} does not answer ({reason}); "
                         "read without the unpersisted option for the persisted rows only, or retry")
