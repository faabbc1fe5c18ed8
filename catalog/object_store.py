"""Object store: one interface over a local directory and S3.

Invariant kept here: an object is either absent or holds exactly the bytes of
one complete ``put``; readers never observe a partially written object, and
``put_if_absent`` is an atomic create-if-absent (compare-and-swap on "absent"):
of any number of concurrent ``put_if_absent`` calls on one key, at most one
returns normally, all others raise :class:`AlreadyExists`.  The preserved
catalog builds its single-committer fencing (docs/ARCHITECTURE.md invariant 8) on this.

* Local directory: ``put`` writes a temporary file in the target directory and
  ``os.replace``-s it; ``put_if_absent`` writes a temporary file and
  ``os.link``-s it to the target (``link`` fails with ``EEXIST`` atomically),
  falling back to ``O_CREAT | O_EXCL`` on file systems without hard links.
  Both return only once the object survives a power loss: the file, its
  directory and the parent of every directory created for it are fsync-ed.
  Files written through pyarrow (Parquet) get the same guarantee from
  ``arrow_prepare_write`` (created directories) and ``arrow_finish_write``
  (the file and its directory), which the writer calls before the preserved
  catalog may name the file.
* S3: ``put_object(..., IfNoneMatch="*")``; S3 answers ``412
  PreconditionFailed`` when the key exists and ``409
  ConditionalRequestConflict`` when a concurrent conditional write to the same
  key is in flight; both mean "you did not create it" and map to
  :class:`AlreadyExists`.

Keys are ``/``-separated relative keys such as
``mydb/data/cpu/2024-01-01/<uuid>.parquet``.  The layout helpers at the bottom
of this module are the only place that builds keys from names.

Stores are created on the Spark driver and shipped to executors, so every
store is picklable: it holds only its configuration, and an S3 store creates
its boto3 client lazily in each process (the client is never pickled).
Unexpected I/O failures (``OSError``, ``botocore`` errors other than the ones
mapped above) propagate unchanged: they are infrastructure failures, not
catalog errors.
"""

from __future__ import annotations

import errno
import os
import threading
import uuid as _uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import quote, unquote, urlsplit

import pyarrow.fs

from iox_spark.catalog.errors import AlreadyExists, InvalidKey, InvalidStoreUrl, NotDurable, ObjectNotFound

__all__ = [
    "DEFAULT_S3_CONNECT_TIMEOUT_S",
    "DEFAULT_S3_MAX_ATTEMPTS",
    "DEFAULT_S3_READ_TIMEOUT_S",
    "DEFAULT_S3_REGION",
    "LocalObjectStore",
    "ObjectMeta",
    "ObjectStore",
    "S3Config",
    "S3ObjectStore",
    "catalog_prefix",
    "data_prefix",
    "encode_key_segment",
    "object_store_from_url",
    "parquet_key",
    "table_of_parquet_key",
]

#: Region used when none is configured (moto and MinIO accept any region).
DEFAULT_S3_REGION = "us-east-1"
#: Seconds to wait for a TCP connection to the S3 endpoint.
DEFAULT_S3_CONNECT_TIMEOUT_S = 5.0
#: Seconds to wait for an S3 response once connected.
DEFAULT_S3_READ_TIMEOUT_S = 60.0
#: Total attempts (first try + retries) botocore makes for one S3 request.
DEFAULT_S3_MAX_ATTEMPTS = 5

# Temporary files of the local store live next to their target and start with
# this prefix; keys may not contain segments starting with "." so a temporary
# file can never collide with (or be listed as) a key.
_LOCAL_TMP_PREFIX = ".tmp-"
_KEY_SEPARATOR = "/"


@dataclass(frozen=True)
class ObjectMeta:
    """One listed object: its key (relative to the store), size and mtime.

    ``last_modified_s`` is seconds since the Unix epoch as reported by the
    backend (file mtime, S3 ``LastModified``).
    """

    key: str
    size_bytes: int
    last_modified_s: float


def _validate_key(key: str) -> str:
    """Return ``key`` if it is a well-formed relative key, else raise InvalidKey."""
    if not isinstance(key, str) or not key:
        raise InvalidKey(key=key, reason="key must be a non-empty string")
    if key.startswith(_KEY_SEPARATOR) or key.endswith(_KEY_SEPARATOR):
        raise InvalidKey(key=key, reason="key must not start or end with '/'")
    if "\\" in key or "\x00" in key:
        raise InvalidKey(key=key, reason="key must not contain '\\' or NUL")
    for segment in key.split(_KEY_SEPARATOR):
        if not segment:
            raise InvalidKey(key=key, reason="key must not contain empty segments")
        if segment.startswith("."):
            raise InvalidKey(key=key, reason=f"segment {segment!r} starts with '.'")
    return key


def _validate_prefix(prefix: str) -> str:
    """Return ``prefix`` if usable for ``list``: "" or a key prefix, possibly ending in '/' or mid-segment."""
    if not isinstance(prefix, str):
        raise InvalidKey(key=prefix, reason="prefix must be a string")
    if prefix.startswith(_KEY_SEPARATOR) or "\\" in prefix or "\x00" in prefix:
        raise InvalidKey(key=prefix, reason="prefix must be relative and contain no '\\' or NUL")
    segments = prefix.split(_KEY_SEPARATOR)
    if any(not s for s in segments[:-1]) or any(s.startswith(".") for s in segments):
        raise InvalidKey(key=prefix, reason="prefix has an empty segment or a segment starting with '.'")
    return prefix


class ObjectStore(ABC):
    """A flat key → bytes store with atomic create-if-absent.

    Used on the driver (catalog, cleanup) and on executors (Parquet writes);
    implementations must be picklable and safe to use from several threads.
    """

    @property
    @abstractmethod
    def url(self) -> str:
        """A string identifying the store, e.g. ``file:///abs/dir`` or ``s3://bucket/prefix``."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key``, replacing any previous object atomically."""

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> None:
        """Create ``key`` holding ``data`` only if it does not exist.

        Raises :class:`AlreadyExists` if the key exists (or, on S3, if a
        concurrent conditional write to it is in flight).  Of concurrent
        callers on one key at most one returns normally.  Callers that need
        fencing must make ``data`` unique per writer (the catalog embeds a
        uuid): the S3 backend treats "the key already holds exactly my bytes"
        as success, so that a request retried after a lost response does not
        report a conflict for its own write.
        """

    @abstractmethod
    def get(self, key: str) -> bytes:
        """Return the bytes stored under ``key``; raise :class:`ObjectNotFound` if absent."""

    def download(self, key: str, path: str) -> None:
        """Write the object ``key`` to the local file ``path`` (created or replaced), streamed in
        pieces where the store allows; raise :class:`ObjectNotFound` if absent."""
        data = self.get(key)
        with open(path, "wb") as f:
            f.write(data)

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Return whether an object is stored under ``key``."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[ObjectMeta]:
        """Return all objects whose key starts with ``prefix`` (a plain string prefix), sorted by key."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Delete ``key``; deleting an absent key is not an error (idempotent)."""

    @abstractmethod
    def arrow_fs(self) -> tuple[pyarrow.fs.FileSystem, str]:
        """Return ``(filesystem, base_path)`` so pyarrow can read/write objects directly.

        The object with key ``k`` is at ``f"{base_path}/{k}"`` on
        ``filesystem`` (see :meth:`arrow_path`).  Writes through pyarrow are
        not atomic: only use them for objects nobody reads before they are
        committed elsewhere (Parquet files become visible through the
        preserved catalog).  Nor are they durable: write through
        :meth:`arrow_prepare_write` and :meth:`arrow_finish_write`.
        """

    def arrow_path(self, key: str) -> str:
        """Return the path of ``key`` on the file system returned by :meth:`arrow_fs`."""
        _, base = self.arrow_fs()
        return f"{base}/{_validate_key(key)}" if base else _validate_key(key)

    def arrow_prepare_write(self, key: str) -> tuple[pyarrow.fs.FileSystem, str]:
        """Return ``(filesystem, path)`` ready for ``pyarrow.parquet.write_table(t, path, filesystem=fs)``.

        Called on the executor that writes the file: creates whatever the
        backend needs before a write (parent directories on a local disk,
        durably: see :class:`LocalObjectStore`; nothing on S3).
        """
        fs, base = self.arrow_fs()
        return fs, f"{base}/{_validate_key(key)}" if base else _validate_key(key)

    def arrow_finish_write(self, keys: Iterable[str]) -> None:
        """Make the objects at ``keys``, written and closed through pyarrow, durable.

        Called on the executor that wrote them (after :meth:`arrow_prepare_write`
        and closing each writer), before their metadata goes to the driver:
        once this returns, the objects survive a power loss, so a preserved
        catalog transaction may name them.  On a local disk: one fsync per
        file and one per distinct directory holding them; on S3 nothing (an
        object exists once its upload completed).  Raises ``OSError`` when a
        file cannot be synced (then it must not be committed).
        """


# --------------------------------------------------------------------------- local


class LocalObjectStore(ObjectStore):
    """Object store in a local directory; key ``a/b/c`` is file ``<root>/a/b/c``.

    Picklable (holds only the absolute root path).  Creates the root directory
    lazily on the first write.  Durability: data and directory entries are
    fsync-ed before a write returns (``put``, ``put_if_absent``); for files
    written through pyarrow, before :meth:`arrow_finish_write` returns.
    Every directory a write creates has its entry made durable (its parent
    fsync-ed) before the write goes on.
    """

    def __init__(self, root_dir: str | os.PathLike[str]) -> None:
        self._root = os.path.abspath(os.fspath(root_dir))

    @property
    def root_dir(self) -> str:
        """The absolute directory holding the objects."""
        return self._root

    @property
    def url(self) -> str:
        return Path(self._root).as_uri()

    def __repr__(self) -> str:
        return f"LocalObjectStore({self._root!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalObjectStore) and other._root == self._root

    def __hash__(self) -> int:
        return hash(("local", self._root))

    def _path(self, key: str) -> str:
        return os.path.join(self._root, *_validate_key(key).split(_KEY_SEPARATOR))

    def _write_temp(self, target: str, data: bytes) -> str:
        directory = os.path.dirname(target)
        _makedirs_durable(directory)
        tmp = os.path.join(directory, f"{_LOCAL_TMP_PREFIX}{_uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            _unlink_quietly(tmp)
            raise
        os.close(fd)
        return tmp

    def put(self, key: str, data: bytes) -> None:
        target = self._path(key)
        tmp = self._write_temp(target, bytes(data))
        try:
            os.replace(tmp, target)
        except BaseException:
            _unlink_quietly(tmp)
            raise
        _fsync_dir(os.path.dirname(target))

    def put_if_absent(self, key: str, data: bytes) -> None:
        target = self._path(key)
        data = bytes(data)
        if os.path.lexists(target):
            raise AlreadyExists(key=key)
        tmp = self._write_temp(target, data)
        try:
            os.link(tmp, target)
        except FileExistsError:
            raise AlreadyExists(key=key) from None
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
                raise
            self._put_if_absent_excl(key, target, data)
        finally:
            _unlink_quietly(tmp)
        _fsync_dir(os.path.dirname(target))

    def _put_if_absent_excl(self, key: str, target: str, data: bytes) -> None:
        """Fallback for file systems without hard links: ``O_EXCL`` create.

        Atomic for "who creates it", but a concurrent reader may see the file
        before its bytes are complete; the link path above has no such window.
        """
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise AlreadyExists(key=key) from None
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            with open(path, "rb") as f:
                return f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFound(key=key) from None

    def exists(self, key: str) -> bool:
        return os.path.isfile(self._path(key))

    def list(self, prefix: str = "") -> list[ObjectMeta]:
        prefix = _validate_prefix(prefix)
        # Walk only the deepest directory that can contain matching keys.
        dir_part = prefix.rsplit(_KEY_SEPARATOR, 1)[0] if _KEY_SEPARATOR in prefix else ""
        start = os.path.join(self._root, *[s for s in dir_part.split(_KEY_SEPARATOR) if s])
        out: list[ObjectMeta] = []
        if not os.path.isdir(start):
            return out
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            rel_dir = os.path.relpath(dirpath, self._root)
            rel_parts = [] if rel_dir == os.curdir else rel_dir.split(os.sep)
            for name in filenames:
                if name.startswith("."):
                    continue  # temporary files and anything that is not a key
                key = _KEY_SEPARATOR.join([*rel_parts, name])
                if not key.startswith(prefix):
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue  # deleted while listing
                out.append(ObjectMeta(key=key, size_bytes=st.st_size, last_modified_s=st.st_mtime))
        out.sort(key=lambda m: m.key)
        return out

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._path(key))
        except FileNotFoundError:
            pass

    def arrow_fs(self) -> tuple[pyarrow.fs.FileSystem, str]:
        """Local file system; ``base_path`` is ``root_dir``.

        pyarrow does not create parent directories on write, nor fsync what
        it wrote: use :meth:`arrow_prepare_write` before writing and
        :meth:`arrow_finish_write` after closing the file.
        """
        return pyarrow.fs.LocalFileSystem(), Path(self._root).as_posix()

    def arrow_prepare_write(self, key: str) -> tuple[pyarrow.fs.FileSystem, str]:
        """Creates the missing parent directories of ``key``, fsync-ing the parent of each one created."""
        _makedirs_durable(os.path.dirname(self._path(key)))
        return super().arrow_prepare_write(key)

    def arrow_finish_write(self, keys: Iterable[str]) -> None:
        """fsync-s each file, then each distinct directory holding them once."""
        directories: dict[str, None] = {}
        for key in keys:
            path = self._path(key)
            _fsync_file(path)
            directories[os.path.dirname(path)] = None
        for directory in directories:
            _fsync_dir(directory)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _fsync_file(path: str) -> None:
    """Make the data of the closed file ``path`` durable; ``OSError`` propagates."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _makedirs_durable(directory: str) -> None:
    """Create ``directory`` and its missing parents, then fsync the parent of each one created.

    A directory another process created concurrently (``mkdir`` fails with
    ``EEXIST``) counts as created here too.  Costs one ``stat`` when
    ``directory`` exists.
    """
    missing: list[str] = []
    current = directory
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for path in reversed(missing):  # outermost first
        try:
            os.mkdir(path)
        except FileExistsError:
            if not os.path.isdir(path):
                raise
    for path in missing:  # deepest first
        _fsync_dir(os.path.dirname(path))


#: errors of opening or fsyncing a directory that mean the file system does not do it at all (as
#: PostgreSQL's fsync_fname counts them), not that it failed: the entry is as durable as it gets there
_DIR_FSYNC_UNSUPPORTED = frozenset({errno.EBADF, errno.EINVAL, errno.EACCES, errno.EISDIR})


def _fsync_dir(directory: str) -> None:
    """Make the entries of `directory` durable. Raises NotDurable when the fsync fails (an I/O
    error: the files just linked or renamed into it may not survive a power loss); a file system
    that cannot fsync directories at all (_DIR_FSYNC_UNSUPPORTED) is left as it is."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError as e:
        if e.errno in _DIR_FSYNC_UNSUPPORTED:
            return
        raise NotDurable(directory, e.errno, f"open: {e.strerror or e}") from e
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in _DIR_FSYNC_UNSUPPORTED:
            raise NotDurable(directory, e.errno, f"fsync: {e.strerror or e}") from e
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- S3


@dataclass(frozen=True)
class S3Config:
    """Where an :class:`S3ObjectStore` keeps its objects.

    ``prefix`` is a key prefix inside ``bucket`` (no leading/trailing '/'
    needed; "" means the bucket root).  ``endpoint_url`` is ``None`` for AWS
    or e.g. ``http://127.0.0.1:5000`` for moto/MinIO.  Credentials left
    ``None`` come from the usual AWS chain in each process (``AWS_ACCESS_KEY_ID``
    / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_SESSION_TOKEN`` env vars, profiles,
    instance roles).  The store never creates the bucket.
    """

    bucket: str
    prefix: str = ""
    endpoint_url: str | None = None
    region: str = DEFAULT_S3_REGION
    access_key_id: str | None = None
    secret_access_key: str | None = None
    connect_timeout_s: float = DEFAULT_S3_CONNECT_TIMEOUT_S
    read_timeout_s: float = DEFAULT_S3_READ_TIMEOUT_S
    max_attempts: int = DEFAULT_S3_MAX_ATTEMPTS

    def __post_init__(self) -> None:
        if not self.bucket or _KEY_SEPARATOR in self.bucket:
            raise InvalidStoreUrl(url=f"s3://{self.bucket}", reason="bucket must be a non-empty name without '/'")
        object.__setattr__(self, "prefix", self.prefix.strip(_KEY_SEPARATOR))
        if self.prefix:
            _validate_key(self.prefix)
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise InvalidStoreUrl(
                url=f"s3://{self.bucket}", reason="give both access_key_id and secret_access_key or neither"
            )


# S3 error codes meaning "a conditional create did not create the object".
_S3_CONDITIONAL_CREATE_LOST = {"PreconditionFailed", "ConditionalRequestConflict", "412", "409"}
_S3_NOT_FOUND = {"NoSuchKey", "404", "NotFound"}
#: bytes per piece of a streamed download (`S3ObjectStore.download`)
_DOWNLOAD_PIECE_BYTES = 1024 * 1024


class S3ObjectStore(ObjectStore):
    """Object store in an S3 bucket under an optional key prefix.

    Picklable: only the :class:`S3Config` is pickled; the boto3 client is
    created lazily (thread-safe) in every process that uses the store.
    """

    def __init__(self, config: S3Config) -> None:
        self._config = config
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._client_lock = threading.Lock()
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"config": self._config}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._config = state["config"]
        self._init_runtime()

    @property
    def config(self) -> S3Config:
        return self._config

    @property
    def url(self) -> str:
        base = f"s3://{self._config.bucket}"
        return f"{base}/{self._config.prefix}" if self._config.prefix else base

    def __repr__(self) -> str:
        return f"S3ObjectStore({self.url!r}, endpoint_url={self._config.endpoint_url!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, S3ObjectStore) and other._config == self._config

    def __hash__(self) -> int:
        return hash(("s3", self._config))

    def _s3(self) -> Any:
        client = self._client
        if client is not None:
            return client
        with self._client_lock:
            if self._client is None:
                import boto3
                from botocore.config import Config

                cfg = self._config
                session = boto3.session.Session(
                    aws_access_key_id=cfg.access_key_id,
                    aws_secret_access_key=cfg.secret_access_key,
                    region_name=cfg.region,
                )
                self._client = session.client(
                    "s3",
                    endpoint_url=cfg.endpoint_url,
                    config=Config(
                        connect_timeout=cfg.connect_timeout_s,
                        read_timeout=cfg.read_timeout_s,
                        retries={"max_attempts": cfg.max_attempts, "mode": "standard"},
                        s3={"addressing_style": "path"} if cfg.endpoint_url else None,
                    ),
                )
            return self._client

    def _full_key(self, key: str) -> str:
        key = _validate_key(key)
        return f"{self._config.prefix}/{key}" if self._config.prefix else key

    def put(self, key: str, data: bytes) -> None:
        self._s3().put_object(Bucket=self._config.bucket, Key=self._full_key(key), Body=bytes(data))

    def put_if_absent(self, key: str, data: bytes) -> None:
        from botocore.exceptions import ClientError

        data = bytes(data)
        try:
            self._s3().put_object(
                Bucket=self._config.bucket, Key=self._full_key(key), Body=data, IfNoneMatch="*"
            )
        except ClientError as exc:
            if _client_error_code(exc) not in _S3_CONDITIONAL_CREATE_LOST:
                raise
            # A retried request whose first attempt succeeded sees 412 for its
            # own object: only report a conflict if the bytes are not ours.
            if _client_error_code(exc) in {"PreconditionFailed", "412"}:
                try:
                    if self.get(key) == data:
                        return
                except ObjectNotFound:
                    pass
            raise AlreadyExists(key=key) from None

    def _body(self, key: str):
        """The streaming body of object ``key``; ObjectNotFound if absent."""
        from botocore.exceptions import ClientError

        try:
            return self._s3().get_object(Bucket=self._config.bucket, Key=self._full_key(key))["Body"]
        except ClientError as exc:
            if _client_error_code(exc) in _S3_NOT_FOUND:
                raise ObjectNotFound(key=key) from None
            raise

    def get(self, key: str) -> bytes:
        with self._body(key) as body:
            return body.read()

    def download(self, key: str, path: str) -> None:
        import shutil

        with self._body(key) as body, open(path, "wb") as f:
            shutil.copyfileobj(body, f, _DOWNLOAD_PIECE_BYTES)

    def exists(self, key: str) -> bool:
        from botocore.exceptions import ClientError

        try:
            self._s3().head_object(Bucket=self._config.bucket, Key=self._full_key(key))
        except ClientError as exc:
            if _client_error_code(exc) in _S3_NOT_FOUND:
                return False
            raise
        return True

    def list(self, prefix: str = "") -> list[ObjectMeta]:
        prefix = _validate_prefix(prefix)
        store_prefix = f"{self._config.prefix}/" if self._config.prefix else ""
        paginator = self._s3().get_paginator("list_objects_v2")
        out: list[ObjectMeta] = []
        for page in paginator.paginate(Bucket=self._config.bucket, Prefix=store_prefix + prefix):
            for obj in page.get("Contents", ()):
                full = obj["Key"]
                if not full.startswith(store_prefix) or full.endswith(_KEY_SEPARATOR):
                    continue  # outside the store, or a "directory" marker (e.g. from pyarrow)
                out.append(
                    ObjectMeta(
                        key=full[len(store_prefix) :],
                        size_bytes=int(obj["Size"]),
                        last_modified_s=obj["LastModified"].timestamp(),
                    )
                )
        out.sort(key=lambda m: m.key)
        return out

    def delete(self, key: str) -> None:
        # S3 DeleteObject on an absent key succeeds: idempotent as required.
        self._s3().delete_object(Bucket=self._config.bucket, Key=self._full_key(key))

    def arrow_fs(self) -> tuple[pyarrow.fs.FileSystem, str]:
        """A ``pyarrow.fs.S3FileSystem`` for the configured endpoint and credentials.

        ``base_path`` is ``bucket[/prefix]``.  The file system is picklable, so
        it can be created on the driver or on an executor.
        """
        cfg = self._config
        kwargs: dict[str, Any] = {
            "region": cfg.region,
            "connect_timeout": cfg.connect_timeout_s,
            "request_timeout": cfg.read_timeout_s,
            "allow_bucket_creation": False,
            "allow_bucket_deletion": False,
        }
        if cfg.access_key_id is not None:
            kwargs["access_key"] = cfg.access_key_id
            kwargs["secret_key"] = cfg.secret_access_key
        if cfg.endpoint_url:
            parts = urlsplit(cfg.endpoint_url)
            if parts.scheme and parts.netloc:
                kwargs["endpoint_override"] = parts.netloc + parts.path.rstrip("/")
                kwargs["scheme"] = parts.scheme
            else:
                kwargs["endpoint_override"] = cfg.endpoint_url
        fs = pyarrow.fs.S3FileSystem(**kwargs)
        base = f"{cfg.bucket}/{cfg.prefix}" if cfg.prefix else cfg.bucket
        return fs, base


def _client_error_code(exc: Any) -> str:
    err = exc.response.get("Error", {}) if hasattr(exc, "response") else {}
    code = str(err.get("Code", ""))
    if code:
        return code
    return str(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))


# --------------------------------------------------------------------------- factory


def object_store_from_url(url: str, s3_endpoint: str | None = None) -> ObjectStore:
    """Build a store from a directory path, ``file://`` URL or ``s3://bucket/prefix``.

    Called on the driver from configuration.  For S3 the endpoint is
    ``s3_endpoint`` if given, else ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL``
    from the environment (resolved here, so a pickled store carries it to the
    executors), else AWS.  Raises :class:`InvalidStoreUrl`.
    """
    if not isinstance(url, str) or not url:
        raise InvalidStoreUrl(url=url, reason="empty object store url")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "s3":
        if not parts.netloc:
            raise InvalidStoreUrl(url=url, reason="s3 url needs a bucket: s3://bucket/prefix")
        endpoint = s3_endpoint or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_S3_REGION
        return S3ObjectStore(
            S3Config(bucket=parts.netloc, prefix=parts.path.strip("/"), endpoint_url=endpoint, region=region,
                     # resolved on the driver: executors (Spark Python workers) may not share its environment
                     access_key_id=os.environ.get("AWS_ACCESS_KEY_ID"),
                     secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY"))
        )
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise InvalidStoreUrl(url=url, reason="file url must be file:///absolute/path")
        from urllib.parse import unquote

        return LocalObjectStore(unquote(parts.path))
    if scheme and len(scheme) > 1:  # "c:" style drive letters are paths
        raise InvalidStoreUrl(url=url, reason=f"unsupported scheme {scheme!r} (use a path, file:// or s3://)")
    return LocalObjectStore(url)


# --------------------------------------------------------------------------- layout


def encode_key_segment(name: str) -> str:
    """Encode a database/table/partition name as exactly one key segment.

    RFC 3986 percent-encoding with only unreserved characters kept, plus a
    leading '.' encoded, so any name (including ``/`` or ``..``) maps to one
    safe segment and distinct names map to distinct segments.
    """
    if not isinstance(name, str) or not name:
        raise InvalidKey(key=name, reason="name must be a non-empty string")
    encoded = quote(name, safe="")
    if encoded.startswith("."):
        encoded = "%2E" + encoded[1:]
    return encoded


def data_prefix(db: str) -> str:
    """``<db>/data/``: the prefix holding every Parquet file of ``db``."""
    return f"{encode_key_segment(db)}/data/"


def catalog_prefix(db: str) -> str:
    """``<db>/catalog/``: the prefix holding the preserved catalog of ``db``."""
    return f"{encode_key_segment(db)}/catalog/"


def parquet_key(db: str, table: str, partition_key: str, uuid: str | _uuid.UUID) -> str:
    """``<db>/data/<table>/<partition>/<uuid>.parquet`` (names encoded by :func:`encode_key_segment`)."""
    return (
        f"{data_prefix(db)}{encode_key_segment(table)}/"
        f"{encode_key_segment(partition_key)}/{encode_key_segment(str(uuid))}.parquet"
    )


def table_of_parquet_key(db: str, key: str) -> str | None:
    """The table named by ``key`` when it has the shape :func:`parquet_key` gives ``db``'s files
    (``<db>/data/<table>/<partition>/<name>``); None for any other key."""
    prefix = data_prefix(db)
    if not key.startswith(prefix):
        return None
    segments = key[len(prefix):].split("/")
    if len(segments) != 3 or not all(segments):
        return None
    return unquote(segments[0])
