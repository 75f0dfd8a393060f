"""Where a run's outputs live, and how they are written and read: the one layer under OUT.

OUT is a local or NFS path, or an object-store URI (``s3://bucket/prefix``, ``gs://bucket/prefix``)
resolved by ``pyarrow.fs``. Credentials and endpoints come from the environment the way the
cloud SDKs read them (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` / ``AWS_ENDPOINT_URL``, an
instance or pod role, ``GOOGLE_APPLICATION_CREDENTIALS``), never from the config file. Every stage
reads and writes OUT through a :class:`Store`; a FAISS index crosses it as bytes.

What "written" means:

* **One file** is seen whole or not at all. On a local or NFS disk it is written to a hidden
  ``.name.tmp`` beside its place and renamed over it (a rename within a folder is atomic). An
  object store has no rename, but it makes an object visible only once its upload completes: the
  whole body is built in memory and sent as one PUT (or one multipart upload completed at the
  end), so a writer killed mid-way leaves no object (at most an incomplete multipart upload, which
  is invisible; a bucket lifecycle rule ``AbortIncompleteMultipartUpload`` reclaims its parts).
  The size read back after the write must match.
* **Synthesis is exactly-once** without renames: a shard's name is a hash of its dialogue ids and
  it is written whole, once all of its dialogues are done; a rerun lists ``synth/`` (S3 and GCS
  list with strong read-after-write consistency) and runs only the dialogues no shard holds. One
  run writes an OUT at a time.
* **A multi-file stage** (the evaluation: ``eval/``, ``index/`` and its ``run.json`` section) is
  staged: written under ``OUT/.staging/<stage>/new/``, validated (each Parquet footer read back
  with the row count that was written, every other file present), then committed. The commit
  point is one object, ``OUT/.staging/<stage>/COMMIT.json``: the list of files and the
  ``run.json`` sections. After it the files are moved into place (local: one rename per top
  folder; object store: a server-side copy per object, then the objects of the previous output
  that the new one lacks are deleted), ``run.json`` is updated and the staging area removed. A
  stage that fails before the commit point changes nothing: the previous outputs and ``run.json``
  stay as they were, and the staging area is removed. A crash after it is rolled forward by the
  stage's next run (every step of the roll-forward can be repeated).
* **A synth shard that cannot be read** (truncated, not Parquet) is quarantined by synthesis:
  moved to ``OUT/quarantine/synth/``, logged in one line, and its dialogues, no longer held by any
  shard, are run again. A readable Parquet file in ``synth/`` that is not a dialogue shard (no
  ``dialogue_id`` / ``case_id`` / ``turns`` columns) is someone else's data: it is never moved, and
  every stage refuses to run with a one-line error naming it.
"""
from __future__ import annotations

import json
import logging
import os
import posixpath
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from mdd.errors import MddError

log = logging.getLogger(__name__)

RUN_JSON = "run.json"
SYNTH = "synth"
QUARANTINE = "quarantine"
STAGING = ".staging"
COMMIT = "COMMIT.json"
# the columns that make a Parquet file a dialogue shard (older shards may lack the others)
SHARD_COLUMNS = ("dialogue_id", "case_id", "turns")


class StorageError(MddError, RuntimeError):
    """OUT cannot be used as asked; the message is one line and names the place."""


class ShardError(StorageError):
    """A file in ``synth/`` that the stage cannot use (the message names it and says what to do)."""


class StageFailed(StorageError):
    """A staged stage failed before its commit point; nothing under OUT was replaced."""


def is_uri(path: str | os.PathLike) -> bool:
    return "://" in str(path)


class Store:
    """A run's output root: a local/NFS folder or an object-store prefix.

    Paths given to its methods are relative to the root, ``/``-separated.
    """

    def __init__(self, root: str | os.PathLike, *, _fs: pafs.FileSystem | None = None,
                 _base: str | None = None) -> None:
        root = str(root)
        if _fs is not None and _base is not None:
            self.fs, self.base = _fs, _base
        elif is_uri(root):
            try:
                self.fs, base = pafs.FileSystem.from_uri(root)
            except (OSError, ValueError, pa.ArrowException) as exc:
                raise StorageError(f"{root}: cannot open the output location: {_first_line(exc)}") from exc
            self.base = base.rstrip("/")
        else:
            self.fs, self.base = pafs.LocalFileSystem(), os.path.abspath(root)
        self.uri = root.rstrip("/") or root
        self.local = isinstance(self.fs, pafs.LocalFileSystem)
        self.written: dict[str, int] | None = None  # rel path -> Parquet rows, while staging

    def __repr__(self) -> str:
        return f"Store({self.uri!r})"

    def __reduce__(self) -> tuple[Any, ...]:  # picklable into Ray workers (the filesystem pickles)
        return (_restore, (self.uri, self.fs, self.base))

    # --- paths ------------------------------------------------------------------------

    def path(self, rel: str = "") -> str:
        """The filesystem path of ``rel`` (what ``pyarrow`` and Ray Data take with ``self.fs``)."""
        return posixpath.join(self.base, rel) if rel else self.base

    def display(self, rel: str = "") -> str:
        """``rel`` as the user named OUT (for messages)."""
        return f"{self.uri}/{rel}" if rel else self.uri

    def sub(self, rel: str) -> "Store":
        return Store(self.display(rel), _fs=self.fs, _base=self.path(rel))

    def local_path(self, rel: str = "") -> str | None:
        return self.path(rel) if self.local else None

    # --- looking ------------------------------------------------------------------------

    def _info(self, rel: str) -> pafs.FileInfo:
        return self.fs.get_file_info(self.path(rel))

    def exists(self, rel: str = "") -> bool:
        return self._info(rel).type != pafs.FileType.NotFound

    def is_file(self, rel: str) -> bool:
        return self._info(rel).type == pafs.FileType.File

    def check_root(self) -> None:
        """OUT must be a folder (or not exist yet): a file there is a one-line error."""
        if self._info("").type == pafs.FileType.File:
            raise StorageError(f"{self.uri}: is a file; --out must name a folder (or a URI prefix)")

    def files(self, rel: str = "", suffix: str = "", recursive: bool = False) -> list[str]:
        """Files under ``rel`` ending in ``suffix``, as paths relative to ``rel``, sorted; hidden
        names (``.x``) are left out. A missing folder has no files."""
        sel = pafs.FileSelector(self.path(rel), recursive=recursive, allow_not_found=True)
        try:
            infos = self.fs.get_file_info(sel)
        except (FileNotFoundError, NotADirectoryError):
            return []
        root = self.path(rel).rstrip("/") + "/"
        out = []
        for info in infos:
            if info.type != pafs.FileType.File or not info.path.startswith(root):
                continue
            name = info.path[len(root):]
            if name.endswith(suffix) and not any(p.startswith(".") for p in name.split("/")):
                out.append(name)
        return sorted(out)

    def file_sizes(self, rel: str = "") -> dict[str, int]:
        """{name: bytes} of the files directly in the folder ``rel`` (one listing)."""
        sel = pafs.FileSelector(self.path(rel), recursive=False, allow_not_found=True)
        try:
            infos = self.fs.get_file_info(sel)
        except (FileNotFoundError, NotADirectoryError):
            return {}
        return {posixpath.basename(i.path): int(i.size) for i in infos if i.type == pafs.FileType.File}

    # --- bytes, text, JSON --------------------------------------------------------------

    def read_bytes(self, rel: str) -> bytes:
        with self.fs.open_input_stream(self.path(rel)) as f:
            return f.read()

    def write_bytes(self, rel: str, data: bytes | pa.Buffer) -> None:
        """Whole or nothing (see the module docstring)."""
        dst = self.path(rel)
        size = len(data) if not isinstance(data, pa.Buffer) else data.size
        if self.local:
            parent, name = posixpath.split(dst)
            os.makedirs(parent, exist_ok=True)
            tmp = posixpath.join(parent, f".{name}.tmp")
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, dst)
            except BaseException:  # a full disk: no half file left behind (the last good one stays)
                with suppress(OSError):
                    os.unlink(tmp)
                raise
            return
        with self.fs.open_output_stream(dst) as f:
            f.write(data)
        got = self._info(rel).size
        if got != size:
            raise StorageError(f"{self.display(rel)}: wrote {size} bytes, the store holds {got}")

    def sha256(self, rel: str) -> str:
        """The SHA-256 of a file, read in pieces."""
        import hashlib

        h = hashlib.sha256()
        with self.fs.open_input_stream(self.path(rel)) as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
        return h.hexdigest()

    def read_text(self, rel: str) -> str:
        return self.read_bytes(rel).decode("utf-8")

    def write_text(self, rel: str, text: str) -> None:
        self.write_bytes(rel, text.encode("utf-8"))

    def read_json(self, rel: str) -> Any:
        return json.loads(self.read_text(rel))

    def write_json(self, rel: str, data: Any) -> None:
        self.write_text(rel, json.dumps(data, ensure_ascii=False, indent=2, default=str))

    # --- tables -------------------------------------------------------------------------

    def write_table(self, table: pa.Table, rel: str, compression: str = "zstd",
                    metadata: dict[str, str] | None = None) -> None:
        """One Parquet file, whole or nothing; the same table gives the same bytes. ``metadata``:
        key-value pairs added to the file's schema metadata (a synth shard's provenance)."""
        if metadata:
            table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                                   **{k.encode(): v.encode() for k, v in metadata.items()}})
        buf = pa.BufferOutputStream()
        pq.write_table(table, buf, compression=compression)
        self.write_bytes(rel, buf.getvalue())
        if self.written is not None:
            self.written[rel] = table.num_rows

    @contextmanager
    def parquet_writer(self, rel: str, schema: pa.Schema, compression: str = "zstd") -> Iterator[Any]:
        """A Parquet file written in pieces (``writer.write(table, row_group_size)``) without
        holding it whole in memory; seen whole or not at all like ``write_table`` (local: a hidden
        temporary file renamed into place; object store: one multipart upload completed at the end)."""
        dst = self.path(rel)
        rows = 0
        if self.local:
            parent, name = posixpath.split(dst)
            os.makedirs(parent, exist_ok=True)
            sink: Any = posixpath.join(parent, f".{name}.tmp")
        else:
            sink = self.fs.open_output_stream(dst)
        try:
            with pq.ParquetWriter(sink, schema, compression=compression) as writer:
                class _Counting:
                    def write(self, table: pa.Table, row_group_size: int | None = None) -> None:
                        nonlocal rows
                        writer.write_table(table, row_group_size=row_group_size)
                        rows += table.num_rows
                yield _Counting()
        finally:
            if not self.local:
                sink.close()
        if self.local:
            os.replace(sink, dst)
        if self.written is not None:
            self.written[rel] = rows

    def parquet_files(self, rel: str) -> list[str]:
        """``rel`` if it is a file, else the ``*.parquet`` files in the folder ``rel`` (by name)."""
        kind = self._info(rel).type
        if kind == pafs.FileType.File:
            return [rel]
        if kind == pafs.FileType.Directory:
            return [posixpath.join(rel, f) for f in self.files(rel, ".parquet")]
        return []

    def read_table(self, rel: str, columns: list[str] | None = None) -> pa.Table:
        """A Parquet file or a folder of them as one table (shards in name order).

        Tolerant of shards written before a column was added: ``columns`` missing from a shard (or
        from all of them) come back as nulls, and shards with extra columns are unified.
        """
        files = self.parquet_files(rel)
        if not files:
            raise FileNotFoundError(f"{self.display(rel)}: no Parquet files")
        tables = []
        for f in files:
            names = self.read_metadata(f).schema.to_arrow_schema().names
            use = [c for c in columns if c in names] if columns else None
            tables.append(pq.read_table(self.path(f), filesystem=self.fs, columns=use))
        table = pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]
        for c in columns or []:
            if c not in table.column_names:
                table = table.append_column(c, pa.nulls(table.num_rows))
        return table.select(columns) if columns else table

    def read_schema_names(self, rel: str) -> list[str] | None:
        """Column names over a Parquet file or folder (union, first-seen order); None when absent."""
        files = self.parquet_files(rel)
        if not files:
            return None
        names: dict[str, None] = {}
        for f in files:
            names.update(dict.fromkeys(self.read_metadata(f).schema.to_arrow_schema().names))
        return list(names)

    def read_metadata(self, rel: str) -> pq.FileMetaData:
        with self.fs.open_input_file(self.path(rel)) as f:
            return pq.read_metadata(f)

    # --- moving, deleting ---------------------------------------------------------------

    def delete(self, rel: str) -> None:
        info = self._info(rel)
        if info.type == pafs.FileType.Directory:
            self.fs.delete_dir(self.path(rel))
        elif info.type == pafs.FileType.File:
            self.fs.delete_file(self.path(rel))

    def copy_to(self, rel: str, other: "Store", other_rel: str) -> None:
        """Copy one file to ``other`` (a Store on the same file system, e.g. a staging area): a hard
        link on a local disk when it can (the files are never modified in place), else a copy; a
        server-side copy on an object store."""
        src, dst = self.path(rel), other.path(other_rel)
        if self.local and other.local:
            os.makedirs(posixpath.dirname(dst), exist_ok=True)
            if os.path.exists(dst):
                os.unlink(dst)
            try:
                os.link(src, dst)
            except OSError:
                import shutil

                shutil.copyfile(src, dst)
            return
        self.fs.copy_file(src, dst)

    def move(self, src: str, dst: str) -> None:
        """A rename on a local disk; on an object store a copy per object, then the delete."""
        if self.local:
            os.makedirs(posixpath.dirname(self.path(dst)), exist_ok=True)
            os.replace(self.path(src), self.path(dst))
            return
        if self._info(src).type == pafs.FileType.Directory:
            for f in self.files(src, recursive=True):
                self.move(posixpath.join(src, f), posixpath.join(dst, f))
            self.delete(src)
            return
        self.fs.copy_file(self.path(src), self.path(dst))
        self.fs.delete_file(self.path(src))

    # --- run.json -----------------------------------------------------------------------

    def read_run_json(self) -> dict[str, Any]:
        """``OUT/run.json`` as a dict ({} when missing or unreadable)."""
        try:
            data = self.read_json(RUN_JSON)
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def update_run_json(self, key: str, value: Any) -> None:
        """Merge one section into ``run.json`` (each stage owns a key), atomically."""
        data = self.read_run_json()
        data[key] = value
        self.write_json(RUN_JSON, data)

    # --- staged stages ------------------------------------------------------------------

    @contextmanager
    def staged(self, stage: str, targets: tuple[str, ...],
               passthrough: tuple[type[BaseException], ...] = ()) -> Iterator["Staging"]:
        """Build a stage's outputs in a staging area; commit them on a clean exit.

        ``targets``: the names the stage replaces as a whole (e.g. ``("eval", "index")``; also files and
        paths below the top, ``("report.html", "export/sft")``); ``passthrough``: exceptions the body
        raises for a user's mistake, raised again as they are (after removing the staging area).
        The body writes through ``staging.out`` (a Store rooted at the staging area) and sets its
        ``run.json`` sections in ``staging.run_json``. Any exception leaves OUT as it was and is
        raised again as :class:`StageFailed` (``KeyboardInterrupt`` as itself).
        """
        self.recover(stage)
        st = Staging(self, stage, targets)
        try:
            yield st
            st.validate()
        except BaseException as exc:
            try:
                _drop_area(self, st.area)
            except OSError:  # a full or read-only disk: the next run removes it
                pass
            if not isinstance(exc, Exception) or isinstance(exc, passthrough):
                raise
            kept = [t for t in targets if self.exists(t)]
            shown = ", ".join(self.display(t) + ("/" if self._info(t).type == pafs.FileType.Directory else "")
                              for t in kept)
            state = f"{shown} and run.json['{stage}'] are unchanged" if kept else "nothing was written"
            inner = innermost(exc)
            if is_write_error(inner):
                raise StageFailed(f"{writable_error(self, inner)} ({state})") from exc
            raise StageFailed(f"failed: {describe_error(exc)} ({state})") from exc
        try:
            st.commit()
        except Exception as exc:
            raise StorageError(f"{stage}: the commit was interrupted ({describe_error(exc)}); the next run of "
                               f"{stage} completes it") from exc

    def recover(self, stage: str) -> None:
        """Finish a commit that a crash interrupted, or remove an unfinished staging area."""
        area = f"{STAGING}/{stage}"
        if not self.exists(area):
            return
        try:
            manifest = self.read_json(f"{area}/{COMMIT}")
        except (OSError, ValueError):
            log.warning("removing the unfinished %s staging area %s", stage, self.display(area))
            _drop_area(self, area)
            return
        log.warning("completing the %s commit that was interrupted in %s", stage, self.display(area))
        _roll_forward(self, area, manifest)


def _restore(uri: str, fs: pafs.FileSystem, base: str) -> Store:
    return Store(uri, _fs=fs, _base=base)


class Staging:
    """The staging area of one run of a stage (see :meth:`Store.staged`)."""

    def __init__(self, store: Store, stage: str, targets: tuple[str, ...]) -> None:
        self.store, self.stage, self.targets = store, stage, tuple(targets)
        self.area = f"{STAGING}/{stage}"
        self.out = store.sub(f"{self.area}/new")
        self.out.written = {}
        self.run_json: dict[str, Any] = {}

    def validate(self) -> None:
        """Every file the stage wrote is there; every Parquet file reads back with its rows."""
        present = set(self.out.files(recursive=True))
        for rel, rows in sorted((self.out.written or {}).items()):  # {} from __init__ on
            if rel not in present:
                raise StorageError(f"{self.out.display(rel)}: written but not found")
            got = self.out.read_metadata(rel).num_rows
            if got != rows:
                raise StorageError(f"{self.out.display(rel)}: {rows} rows written, {got} read back")
        stray = [f for f in present if not any(_under(f, t) for t in self.targets)]
        if stray:
            raise StorageError(f"{self.stage}: wrote outside its outputs {self.targets}: {stray[0]}")

    def commit(self) -> None:
        manifest = {"stage": self.stage, "targets": list(self.targets),
                    "files": self.out.files(recursive=True), "run_json": self.run_json}
        self.store.write_json(f"{self.area}/{COMMIT}", manifest)  # the commit point
        _roll_forward(self.store, self.area, manifest)


def _roll_forward(store: Store, area: str, manifest: dict[str, Any]) -> None:
    """Put a committed stage's files in place; every step may run again after a crash."""
    files = list(manifest["files"])
    for target in manifest["targets"]:
        new = [f for f in files if _under(f, target)]
        if store.local:
            src, old = f"{area}/new/{target}", f"{area}/old/{target}"
            if store.exists(src) or not new:
                if store.exists(target):
                    store.delete(old)
                    store.move(target, old)
                if store.exists(src):
                    store.move(src, target)
        else:
            for f in new:
                if store.exists(f"{area}/new/{f}"):
                    store.fs.copy_file(store.path(f"{area}/new/{f}"), store.path(f))
                    store.delete(f"{area}/new/{f}")
            keep = set(new)
            for f in store.files(target, recursive=True):
                if f"{target}/{f}" not in keep:
                    store.delete(f"{target}/{f}")
    for key, value in manifest.get("run_json", {}).items():
        store.update_run_json(key, value)
    _drop_area(store, area)


def _under(f: str, target: str) -> bool:
    return f == target or f.startswith(target.rstrip("/") + "/")


def _drop_area(store: Store, area: str) -> None:
    store.delete(area)
    if not store.files(STAGING, recursive=True):  # (object stores keep empty "folder" markers)
        store.delete(STAGING)


# --- synth/ -------------------------------------------------------------------------------


def dialogue_shards(store: Store, *, quarantine: bool) -> tuple[dict[str, list[str]], list[dict[str, str]]]:
    """The dialogue shards in ``synth/`` and the dialogue ids each holds, by shard name; and the
    shards quarantined (``shard``, ``moved_to``, ``reason``).

    A file that cannot be read as Parquet is corrupt: moved to ``quarantine/synth/`` (logged in
    one line) when ``quarantine``, else :class:`ShardError`. A readable file without the dialogue
    columns is foreign: :class:`ShardError`, never moved. Leftover temporary files of a killed
    local writer are removed.
    """
    if store.local:
        d = store.local_path(SYNTH)
        assert d is not None  # a local store has local paths
        if os.path.isdir(d):
            for name in os.listdir(d):
                if name.startswith(".") and name.endswith(".tmp"):
                    os.unlink(os.path.join(d, name))
    shards: dict[str, list[str]] = {}
    moved: list[dict[str, str]] = []
    for name in store.files(SYNTH, ".parquet"):
        rel = f"{SYNTH}/{name}"
        try:
            names = store.read_metadata(rel).schema.to_arrow_schema().names
        except (OSError, pa.ArrowException) as exc:
            moved.append(_corrupt(store, rel, exc, quarantine))
            continue
        missing = [c for c in SHARD_COLUMNS if c not in names]
        if missing:
            raise ShardError(
                f"{store.display(rel)} is not a dialogue shard (no column {', '.join(missing)}): mdd keeps "
                f"only its own shards in {store.display(SYNTH)}/; move the file elsewhere or choose another --out")
        try:
            shards[name] = store.read_table(rel, columns=["dialogue_id"]).column(0).to_pylist()
        except (OSError, pa.ArrowException) as exc:
            moved.append(_corrupt(store, rel, exc, quarantine))
    return shards, moved


def duplicate_rows(shards: dict[str, list[str]]) -> dict[str, list[int]]:
    """Per shard (from :func:`dialogue_shards`), the rows whose dialogue id an earlier row already
    has, shards in name order: the rows every reader skips. An output written by two runs at once
    before the run lock, or by an older version, can hold a dialogue twice; each id is read once."""
    seen: set[str] = set()
    out: dict[str, list[int]] = {}
    for name in sorted(shards):
        dup = []
        for i, d in enumerate(shards[name]):
            if d in seen:
                dup.append(i)
            seen.add(d)
        if dup:
            out[name] = dup
    return out


def without_rows(table: pa.Table, rows: Sequence[int]) -> pa.Table:
    """``table`` without the rows at ``rows`` (positions)."""
    if not rows:
        return table
    import numpy as np

    keep = np.ones(table.num_rows, dtype=bool)
    keep[list(rows)] = False
    return table.filter(pa.array(keep))


def first_rows(table: pa.Table, keys: Sequence[str]) -> tuple[pa.Table, int]:
    """``table`` without the rows whose ``keys`` an earlier row already has, and how many were dropped."""
    if table.num_rows == 0 or any(k not in table.column_names for k in keys):
        return table, 0
    import numpy as np

    idx = pa.array(np.arange(table.num_rows, dtype=np.int64))
    firsts = (pa.table({**{k: table.column(k) for k in keys}, "__row": idx})
              .group_by(list(keys), use_threads=False).aggregate([("__row", "min")]).column("__row_min"))
    if len(firsts) == table.num_rows:
        return table, 0
    return table.take(pa.array(np.sort(firsts.to_numpy()))), table.num_rows - len(firsts)


def log_duplicates(where: str, n: int) -> None:
    if n:
        log.warning("%s: %d row(s) repeat a dialogue id an earlier row has (an output written twice at once, "
                    "before the run lock): each dialogue is read once", where, n)


def _corrupt(store: Store, rel: str, exc: BaseException, quarantine: bool) -> dict[str, str]:
    reason = _first_line(exc)
    if not quarantine:
        raise ShardError(f"{store.display(rel)} cannot be read ({reason}); a synthesis run into this output moves "
                         f"it to {store.display(QUARANTINE)}/ and writes its dialogues again")
    dst = f"{QUARANTINE}/{rel}"
    k = 1
    while store.exists(dst):
        dst = f"{QUARANTINE}/{rel}.{k}"
        k += 1
    store.move(rel, dst)
    log.warning("quarantined %s -> %s (%s); its dialogues will be written again", store.display(rel),
                store.display(dst), reason)
    return {"shard": rel, "moved_to": dst, "reason": reason}


# --- errors -------------------------------------------------------------------------------


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def innermost(exc: BaseException) -> BaseException:
    """The innermost cause (Ray wraps a worker's error in its own)."""
    seen: set[int] = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        inner = getattr(exc, "cause", None)
        inner = inner if isinstance(inner, BaseException) else exc.__cause__
        if inner is None:
            break
        exc = inner
    return exc


def describe_error(exc: BaseException) -> str:
    """One line for the user: the innermost cause (Ray wraps a worker's error in its own)."""
    exc = innermost(exc)
    text = _first_line(exc)
    return text if isinstance(exc, StorageError) else f"{type(exc).__name__}: {text}"


# --- one run at a time per OUT -------------------------------------------------------------

LOCK = ".mdd.lock"
_HELD: dict[str, int] = {}  # lock paths this process holds -> nesting depth (``mdd run`` calls the others)


class LockHeld(StorageError):
    """Another mdd run holds OUT's lock (the message names it: command, pid, host, start)."""


def _proc_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (``/proc/PID/stat`` field 22): tells a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _alive(holder: dict[str, Any]) -> bool | None:
    """Whether the holder still runs: True / False on this host, None when it cannot be told
    (another host: its lock is left alone)."""
    import socket

    if holder.get("host") != socket.gethostname():
        return None
    try:
        pid = int(holder.get("pid"))  # type: ignore[arg-type]  # None or junk: TypeError / ValueError below
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by another user
        return True
    except (TypeError, ValueError):
        return False
    start = holder.get("pid_start")
    return not (start and _proc_start(pid) not in (None, start))  # the pid was reused by another process


def describe_holder(holder: dict[str, Any]) -> str:
    return (f"`mdd {holder.get('command') or '?'}` (pid {holder.get('pid')} on {holder.get('host')}, "
            f"started {holder.get('started')})")


class RunLock:
    """``OUT/.mdd.lock``: the holder's command, pid, host and start time, so that one mdd run at a
    time writes an OUT. Taken with ``O_CREAT | O_EXCL`` on a local or NFS disk (atomic); on an
    object store written when absent and read back (two runs starting in the same instant may both
    believe they won: keep one run per prefix there). A lock whose holder is gone (same host, the
    pid no longer runs, or runs another program) is stale: logged and taken over. Re-entrant within
    one process (``mdd run`` calls synthesize, evaluate and report)."""

    def __init__(self, store: Store, command: str) -> None:
        self.store, self.command = store, command
        self.key = store.path(LOCK) if store.local else store.display(LOCK)

    def _mine(self) -> dict[str, Any]:
        import datetime
        import socket

        pid = os.getpid()
        return {"command": self.command, "pid": pid, "host": socket.gethostname(), "pid_start": _proc_start(pid),
                "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}

    def holder(self) -> dict[str, Any] | None:
        try:
            data = self.store.read_json(LOCK)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return {}  # being written, or damaged: judged by its age in _try
        return data if isinstance(data, dict) else {}

    def _create(self, data: dict[str, Any]) -> bool:
        body = json.dumps(data, ensure_ascii=False).encode()
        if self.store.local:
            path = self.store.path(LOCK)
            os.makedirs(posixpath.dirname(path), exist_ok=True)
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                return False
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(body)
            except BaseException:  # a full disk: no empty lock left behind
                with suppress(OSError):
                    os.unlink(path)
                raise
            return True
        if self.store.exists(LOCK):
            return False
        self.store.write_bytes(LOCK, body)
        return self.holder() == data

    def _try(self) -> dict[str, Any] | None:
        """None when taken; else the holder."""
        mine = self._mine()
        for _ in range(3):
            if self._create(mine):
                return None
            holder = self.holder()
            if holder is None:
                continue  # released in between
            if holder == {}:  # unreadable: a writer killed between create and write, if old enough
                info = self.store._info(LOCK)
                age = time.time() - (info.mtime.timestamp() if info.mtime else time.time())
                if age < 10:
                    return {"command": "?", "pid": "?", "host": "?", "started": "just now"}
            elif _alive(holder) is not False:
                return holder
            log.warning("taking over the stale lock %s of %s (no longer running)", self.key,
                        describe_holder(holder) if holder else "an unreadable lock file")
            try:
                self.store.delete(LOCK)
            except FileNotFoundError:
                pass
        return self.holder() or {}

    def acquire(self, wait: bool = False, poll_s: float = 1.0) -> None:
        if _HELD.get(self.key):
            _HELD[self.key] += 1
            return
        told = False
        while (holder := self._try()) is not None:
            if not wait:
                raise LockHeld(f"{self.store.display()} is in use by {describe_holder(holder)}: wait for it to "
                               f"finish, rerun with --wait, or use another --out")
            if not told:
                print(f"waiting for {describe_holder(holder)} to release {self.store.display()} ...", file=sys.stderr,
                      flush=True)
                told = True
            time.sleep(poll_s)
        _HELD[self.key] = 1
        sweep_tmp(self.store)

    def release(self) -> None:
        n = _HELD.get(self.key, 0)
        if n > 1:
            _HELD[self.key] = n - 1
            return
        _HELD.pop(self.key, None)
        holder = self.holder()
        if holder and holder.get("pid") == os.getpid():
            try:
                self.store.delete(LOCK)
            except OSError as exc:  # a read-only folder by now: the next run finds it stale
                log.warning("could not remove %s: %s", self.key, _first_line(exc))


@contextmanager
def run_lock(out: "str | os.PathLike | Store", command: str, wait: bool = False,
             create: bool = True) -> Iterator[Store]:
    """Hold OUT's lock for the body (see :class:`RunLock`); :class:`LockHeld` when another run holds it.
    ``create=False`` (commands that only add to a run): an OUT that does not exist is not made for
    the lock; the body runs unlocked and says what is missing."""
    store = open_store(out)
    store.check_root()
    if not create and not store.exists():
        yield store
        return
    lock = RunLock(store, command)
    try:
        lock.acquire(wait)
    except LockHeld:
        raise
    except OSError as exc:
        raise writable_error(store, exc) from exc
    try:
        yield store
    except OSError as exc:
        if is_write_error(exc):
            raise writable_error(store, exc) from exc
        raise
    finally:
        lock.release()


def sweep_tmp(store: Store) -> list[str]:
    """Remove the hidden ``.name.tmp`` files a killed or failed local writer left under OUT (only
    while holding its lock: no writer of this OUT is running). Folders with a lock of their own
    (another OUT inside this one, e.g. ``rounds/1``) are left to their runs."""
    if not store.local or not os.path.isdir(store.path()):
        return []
    removed = []
    for dirpath, dirnames, filenames in os.walk(store.path()):
        if dirpath != store.path() and LOCK in filenames:
            dirnames[:] = []
            continue
        for name in filenames:
            if name.startswith(".") and name.endswith(".tmp"):
                try:
                    os.unlink(os.path.join(dirpath, name))
                    removed.append(os.path.relpath(os.path.join(dirpath, name), store.path()))
                except OSError:
                    pass
    if removed:
        log.info("removed %d temporary file(s) a previous run left in %s", len(removed), store.display())
    return removed


# --- a folder that cannot be written --------------------------------------------------------

_WRITE_WORDS = ("read-only file system", "no space left", "disk quota exceeded", "permission denied")


def is_write_error(exc: BaseException) -> bool:
    """A read-only, full or forbidden OUT (an OSError, or pyarrow's, which may carry only the text)."""
    import errno

    if getattr(exc, "errno", None) in (errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM):
        return True
    return isinstance(exc, OSError) and any(w in str(exc).lower() for w in _WRITE_WORDS)


def writable_error(store: Store, exc: BaseException) -> StorageError:
    """One line for a write that failed on OUT: read-only, full, or not allowed; names the path and the fix."""
    import errno

    code = getattr(exc, "errno", None)
    text = str(exc).lower()
    if code is None:  # pyarrow's errors carry the reason as text only
        code = next((c for w, c in zip(_WRITE_WORDS, (errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EACCES))
                     if w in text), None)
    where = getattr(exc, "filename", None) or store.display()
    if code == errno.EROFS:
        return StorageError(f"{where}: the file system is read-only; choose an --out on a writable disk "
                            f"(or remount it read-write)")
    if code in (errno.ENOSPC, errno.EDQUOT):
        return StorageError(f"{where}: no space left on the device; free some space or choose an --out on "
                            f"another disk, then rerun (finished work is kept)")
    if code in (errno.EACCES, errno.EPERM):
        return StorageError(f"{where}: permission denied; make {store.display()} writable for this user or "
                            f"choose another --out")
    return StorageError(f"{where}: cannot write ({_first_line(exc)}); check the disk, or choose another --out")


# --- the functions other modules call with a path or URI -----------------------------------


def open_store(out: "str | os.PathLike | Store") -> Store:
    return out if isinstance(out, Store) else Store(out)


def _split(path: str | os.PathLike) -> tuple[Store, str]:
    parent, name = posixpath.split(str(path).rstrip("/"))
    return Store(parent or "."), name


def write_table(table: pa.Table, path: str | os.PathLike) -> None:
    """Atomic: readers (and a rerun after kill -9) see the whole file or none."""
    store, name = _split(path)
    store.write_table(table, name)


def write_bytes(data: bytes, path: str | os.PathLike) -> None:
    """Atomic, like ``write_table``: a report, a plot, a card or an export file."""
    store, name = _split(path)
    store.write_bytes(name, data)


def write_text(text: str, path: str | os.PathLike) -> None:
    write_bytes(text.encode("utf-8"), path)


def read_schema_names(path: str | os.PathLike) -> list[str] | None:
    """Column names over a Parquet file or folder (union, first-seen order); None when absent."""
    store, name = _split(path)
    return store.read_schema_names(name)


def read_table(path: str | os.PathLike, columns: list[str] | None = None) -> pa.Table | None:
    """A Parquet file or a folder of them as one table (see :meth:`Store.read_table`); None when absent."""
    store, name = _split(path)
    return store.read_table(name, columns) if store.parquet_files(name) else None


def read_run_json(out: "str | os.PathLike | Store") -> dict[str, Any]:
    return open_store(out).read_run_json()


def update_run_json(out: "str | os.PathLike | Store", key: str, value: Any) -> None:
    open_store(out).update_run_json(key, value)
