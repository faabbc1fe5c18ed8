"""The options of `spark.read.format("iox")`: parsed once, all checked, none ignored.

Invariant: :func:`parse_options` returns a :class:`ReadOptions` only when every
option given is known and well-formed; an unknown option, a missing required one
or a malformed value raises :class:`~iox_spark.source.errors.InvalidOption`, and
the reserved ``assigner`` option raises
:class:`~iox_spark.source.errors.AssignerNotAvailable` (never silently ignored).
Option names are case-insensitive, as Spark's are.

Pure apart from :meth:`ReadOptions.store`, which resolves the S3 settings the
options leave out from the driver's environment (``AWS_ENDPOINT_URL_S3`` /
``AWS_ENDPOINT_URL``, ``AWS_REGION`` / ``AWS_DEFAULT_REGION``,
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``, as the server does); the store
it returns carries them pickled to the executors, which need no environment of
their own. Runs on the driver.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass

from iox_spark.catalog.errors import CatalogError
from iox_spark.catalog.object_store import ObjectStore, S3ObjectStore, object_store_from_url

from iox_spark.source.errors import AssignerNotAvailable, InvalidOption

__all__ = ["OPTION_OBJECT_STORE", "OPTION_DATABASE", "OPTION_TABLE", "OPTION_REVISION", "OPTION_S3_ENDPOINT",
           "OPTION_S3_REGION", "OPTION_S3_ACCESS_KEY_ID", "OPTION_S3_SECRET_ACCESS_KEY", "OPTION_ASSIGNER",
           "OPTION_UNPERSISTED", "OPTION_TOKEN", "KNOWN_OPTIONS", "ReadOptions", "parse_options"]

#: a directory, file:///dir or s3://bucket/prefix: the server's --object-store
OPTION_OBJECT_STORE = "object_store"
OPTION_DATABASE = "database"
OPTION_TABLE = "table"
#: the preserved catalog revision to read (default: the newest committed when the read is planned)
OPTION_REVISION = "revision"
OPTION_S3_ENDPOINT = "s3_endpoint"
OPTION_S3_REGION = "s3_region"
OPTION_S3_ACCESS_KEY_ID = "s3_access_key_id"
OPTION_S3_SECRET_ACCESS_KEY = "s3_secret_access_key"
#: reserved: the assigner serves no reads (its error names `unpersisted`)
OPTION_ASSIGNER = "assigner"
#: "true": add the rows the ingester pool's owners hold and have not persisted (iox_spark/source/owner_rows.py)
OPTION_UNPERSISTED = "unpersisted"
#: the token the pool's members require (their --auth-token), for `unpersisted`
OPTION_TOKEN = "token"
KNOWN_OPTIONS = (OPTION_OBJECT_STORE, OPTION_DATABASE, OPTION_TABLE, OPTION_REVISION, OPTION_S3_ENDPOINT,
                 OPTION_S3_REGION, OPTION_S3_ACCESS_KEY_ID, OPTION_S3_SECRET_ACCESS_KEY, OPTION_ASSIGNER,
                 OPTION_UNPERSISTED, OPTION_TOKEN)
_REQUIRED = (OPTION_OBJECT_STORE, OPTION_DATABASE, OPTION_TABLE)
_S3_ONLY = (OPTION_S3_ENDPOINT, OPTION_S3_REGION, OPTION_S3_ACCESS_KEY_ID, OPTION_S3_SECRET_ACCESS_KEY)


@dataclass(frozen=True)
class ReadOptions:
    """What to read: a table of a database in an object store, as of a catalog revision.

    Picklable; its ``repr`` never shows the secret key."""

    object_store: str
    database: str
    table: str
    #: None: the newest revision when the read is planned
    revision: int | None = None
    s3_endpoint: str | None = None
    s3_region: str | None = None
    s3_access_key_id: str | None = None
    s3_secret_access_key: str | None = dataclasses.field(default=None, repr=False)
    #: add the pool owners' unpersisted rows (never with `revision`: those rows are of now)
    unpersisted: bool = False
    token: str | None = dataclasses.field(default=None, repr=False)

    def store(self) -> ObjectStore:
        """The object store the options name (driver side; picklable, for the executors)."""
        try:
            store = object_store_from_url(self.object_store, self.s3_endpoint)
        except CatalogError as exc:
            raise InvalidOption(OPTION_OBJECT_STORE, str(exc)) from exc
        if not isinstance(store, S3ObjectStore):
            given = [o for o in _S3_ONLY if getattr(self, o) is not None]
            if given:
                raise InvalidOption(given[0], f"is for an s3:// object store, not {self.object_store!r}")
            return store
        cfg = store.config
        overrides = {}
        if self.s3_region is not None:
            overrides["region"] = self.s3_region
        if self.s3_access_key_id is not None:
            overrides["access_key_id"] = self.s3_access_key_id
            overrides["secret_access_key"] = self.s3_secret_access_key
        try:
            return S3ObjectStore(dataclasses.replace(cfg, **overrides)) if overrides else store
        except CatalogError as exc:
            raise InvalidOption(OPTION_S3_ACCESS_KEY_ID, str(exc)) from exc


def parse_options(options: Mapping[str, str]) -> ReadOptions:
    """The :class:`ReadOptions` of the data source's `options` (names case-insensitive)."""
    opts = {}
    for name, value in options.items():
        key = str(name).lower()
        if key not in KNOWN_OPTIONS:
            raise InvalidOption(key, f"unknown option; the options are {', '.join(KNOWN_OPTIONS)}")
        opts[key] = value
    if opts.get(OPTION_ASSIGNER) is not None:
        raise AssignerNotAvailable(str(opts[OPTION_ASSIGNER]))
    for name in _REQUIRED:
        if not isinstance(opts.get(name), str) or not opts[name].strip():
            raise InvalidOption(name, f"required: .option({name!r}, ...)")
    for name in _S3_ONLY:
        if name in opts and (not isinstance(opts[name], str) or not opts[name].strip()):
            raise InvalidOption(name, "must not be empty")
    if (OPTION_S3_ACCESS_KEY_ID in opts) != (OPTION_S3_SECRET_ACCESS_KEY in opts):
        missing = OPTION_S3_SECRET_ACCESS_KEY if OPTION_S3_ACCESS_KEY_ID in opts else OPTION_S3_ACCESS_KEY_ID
        raise InvalidOption(missing, "give s3_access_key_id and s3_secret_access_key together")
    unpersisted = str(opts.get(OPTION_UNPERSISTED, "false")).strip().lower()
    if unpersisted not in ("true", "false"):
        raise InvalidOption(OPTION_UNPERSISTED, f"must be true or false, got {opts[OPTION_UNPERSISTED]!r}")
    if unpersisted == "true" and opts.get(OPTION_REVISION) is not None:
        raise InvalidOption(OPTION_UNPERSISTED, "reads the rows of now: it cannot go with a revision")
    return ReadOptions(object_store=opts[OPTION_OBJECT_STORE].strip(), database=opts[OPTION_DATABASE],
                       table=opts[OPTION_TABLE], revision=_revision(opts.get(OPTION_REVISION)),
                       s3_endpoint=opts.get(OPTION_S3_ENDPOINT), s3_region=opts.get(OPTION_S3_REGION),
                       s3_access_key_id=opts.get(OPTION_S3_ACCESS_KEY_ID),
                       s3_secret_access_key=opts.get(OPTION_S3_SECRET_ACCESS_KEY),
                       unpersisted=unpersisted == "true", token=opts.get(OPTION_TOKEN) or None)


def _revision(value) -> int | None:
    if value is None:
        return None
    text = str(value).strip()
    if not re.fullmatch(r"[0-9]+", text):
        raise InvalidOption(OPTION_REVISION, f"must be a catalog revision (an integer >= 0), got {value!r}")
    return int(text)
