"""Storage faults: a write to the lake that failed, worded for a person.

delta-rs reports a full disk as `DeltaError('Failed to parse parquet: External: Generic
LocalFileSystem error: Unable to copy data to file: No space left on device (os error 28)')`, with
no table in it, and a read-only folder on a delete as a multi-line `OSError` with terminal colour
codes. Every commit to a queue's tables, its journal and its plans goes through `writing`, which
turns such an error into a `StorageFailure` naming the table (or file), what was being written and
the operating system's error, and keeps the original as its cause.
"""

from __future__ import annotations

import errno as errnos
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager

from deltalake.exceptions import CommitFailedError, DeltaError, DeltaProtocolError, SchemaMismatchError

from poison_pipeline.domain.redaction import redact

_OS_ERROR = re.compile(r"\(os error (\d+)\)")
_COLOURS = re.compile(r"\x1b\[[0-9;]*m")
# object_store's own errors (`Generic S3 error: ...`), not delta-rs's logical ones (`Generic DeltaTable error`).
_STORE_ERROR = re.compile(r"ObjectStore|Generic (?!DeltaTable)\w+ error")
# Not storage faults: a lost commit race (the callers retry or report it) and mistakes in the data.
_NOT_FAULTS = (CommitFailedError, DeltaProtocolError, SchemaMismatchError)


class StorageFailure(OSError):
    """A write to the lake failed. `str()` names what was written where and the OS error; `errno`
    is the OS error number when one is known (ENOSPC, EROFS, EIO, ...)."""

    def __init__(self, doing: str, where: str, cause: BaseException, then: str = "") -> None:
        self.doing, self.where, self.then = doing, where, then
        self.code = _errno_of(cause)
        # The library's words may repeat a request's URL and the credentials in it.
        self.cause = redact(_describe(cause, self.code))
        text = redact(f"storage failure while {doing} ({where}): {self.cause}" + (f". {then}" if then else ""))
        super().__init__(self.code or 0, text)
        self.__cause__ = cause

    def __str__(self) -> str:
        return str(self.strerror)

    def meaning(self, then: str) -> StorageFailure:
        """The same failure, saying what it means for the work that was under way."""
        cause = self.__cause__ if self.__cause__ is not None else self
        return StorageFailure(self.doing, self.where, cause, then)


def _errno_of(error: BaseException) -> int | None:
    if isinstance(error, OSError) and error.errno:
        return error.errno
    found = _OS_ERROR.findall(str(error))
    return int(found[-1]) if found else None


def _describe(error: BaseException, code: int | None) -> str:
    """The OS error first (`No space left on device [ENOSPC]`), then the library's words on one line."""
    said = " ".join(_COLOURS.sub("", str(error)).replace("↳", " ").split())
    if code is None:
        return f"{type(error).__name__}: {said}"
    name = errnos.errorcode.get(code, str(code))
    return f"{os.strerror(code)} [{name}] ({said})"


# What an object store answers when the lake cannot be reached at all, and what to tell the user:
# the store and the setting to look at. Matched on object_store's words; the endpoint named is
# shown through `redact`, as every text from the store is (it may hold credentials).
_UNREACHABLE = (
    (re.compile(r"NoSuchBucket|BucketNotFound|ContainerNotFound|The specified (bucket|container) does not exist"),
     "the bucket or container of lake_root does not exist on the store{holder}: create it, or correct lake_root"),
    (re.compile(r"InvalidAccessKeyId|SignatureDoesNotMatch|AccessDenied|AuthenticationFailed|"
                r"AuthorizationFailure|Forbidden|403 Forbidden|401 Unauthorized|ExpiredToken"),
     "the store refused the credentials{endpoint}: check the credentials in storage_options "
     "({credentials}) or the environment"),
    (re.compile(r"tcp connect error|dns error|Connection refused|error sending request|timed out"),
     "the store cannot be reached{endpoint}: check storage_options.{endpoint_option}, the network, and "
     "{allow_http} for an http:// endpoint"),
)
_BUCKET = re.compile(r"<BucketName>([^<]+)</BucketName>")
# The request that failed: its endpoint, and the first two segments of its path (path-style URLs
# name the bucket first; Azure's name the container first, or the account then the container on an
# endpoint of its own such as the emulator's).
_ENDPOINT = re.compile(r"(?:GET|PUT|HEAD|POST|DELETE) (https?://[^/\s?]+)(?:/([^/\s?]+))?(?:/([^/\s?]+))?")
# Azure Blob storage: object_store's name for it, its error codes, its hosts.
_AZURE = re.compile(r"MicrosoftAzure|ContainerNotFound|AuthenticationFailed|AuthorizationFailure|\.core\.windows\.net")
# The options to name, by store: S3's for any store not known to be Azure's.
_OPTIONS = {
    "s3": {"credentials": "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AZURE_STORAGE_ACCOUNT_KEY, "
                          "GOOGLE_SERVICE_ACCOUNT, ...",
           "endpoint_option": "AWS_ENDPOINT_URL (or the store's endpoint option)", "allow_http": "AWS_ALLOW_HTTP"},
    "azure": {"credentials": "AZURE_STORAGE_ACCOUNT_NAME / AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_KEY, "
                             "AZURE_CLIENT_ID / AZURE_CLIENT_SECRET / AZURE_TENANT_ID, ...",
              "endpoint_option": "AZURE_STORAGE_ENDPOINT (or AZURE_STORAGE_ACCOUNT_NAME)",
              "allow_http": "AZURE_ALLOW_HTTP"},
}


def store_problem(error: BaseException) -> str | None:
    """What is wrong with the store, for a person, when `error` says the lake cannot be reached at
    all (no such bucket, credentials refused, no route to the endpoint); None for any other error."""
    said = _COLOURS.sub("", str(error))
    for pattern, advice in _UNREACHABLE:
        if pattern.search(said):
            if _AZURE.search(said):
                endpoint, holder, kind = *_azure_request(said), "container"
                options = _OPTIONS["azure"]
            else:
                request = _ENDPOINT.search(said)
                listed = _BUCKET.search(said)
                endpoint = request.group(1) if request else None
                holder = listed.group(1) if listed else (request.group(2) if request else None)
                kind, options = "bucket", _OPTIONS["s3"]
            where = ", ".join(part for part in (f"endpoint {endpoint}" if endpoint else "",
                                                f"{kind} {holder!r}" if holder else "") if part)
            return redact(advice.format(holder=f" ({kind} {holder!r})" if holder else "",
                                        endpoint=f" ({where})" if where else "", **options))
    return None


def _azure_request(said: str) -> tuple[str | None, str | None]:
    """The endpoint and container of the Azure request in `said`: the container is the first
    segment of the path on Azure's own hosts, the second on an endpoint of its own (the first is
    the account there: http://127.0.0.1:10000/devstoreaccount1/container/...)."""
    request = _ENDPOINT.search(said)
    if request is None:
        return None, None
    host, first, second = request.groups()
    if host.endswith(".core.windows.net") or first is None:
        return host, first
    return f"{host}/{first}", second


def is_fault(error: BaseException) -> bool:
    """An error of the storage itself, as opposed to a lost commit race or invalid data."""
    if isinstance(error, StorageFailure):
        return False  # already worded
    if isinstance(error, _NOT_FAULTS):
        return False
    if isinstance(error, OSError):
        return True
    return isinstance(error, DeltaError) and (_OS_ERROR.search(str(error)) is not None
                                              or _STORE_ERROR.search(str(error)) is not None)


@contextmanager
def writing(doing: str, where: str) -> Iterator[None]:
    """Turn a storage fault raised in the block into a StorageFailure saying what and where."""
    try:
        yield
    except Exception as error:
        if is_fault(error):
            raise StorageFailure(doing, where, error) from error
        raise


def shown(error: BaseException) -> str:
    """A storage error as one line for a person: a StorageFailure as worded, an unreachable store's
    advice, else the library's words; credentials masked (`redact`)."""
    if isinstance(error, StorageFailure):
        return str(error)
    said = " ".join(str(error).split())
    return redact(store_problem(error) or f"{type(error).__name__}: {said}")


class ShownFailure(OSError):
    """A storage error as a Dagster run's log shows it: `shown`'s line, without the chain of library
    errors under it (which repeat the request's URL)."""

    def __str__(self) -> str:
        return str(self.strerror)


@contextmanager
def redacted_failures() -> Iterator[None]:
    """Re-raise a storage error of the block without the library's errors under it, as a
    StorageFailure or a ShownFailure: Dagster records an error with its causes, and delta-rs's may
    carry credentials."""
    try:
        yield
    except StorageFailure as failure:
        raise failure from None  # its own words are redacted; its causes are the library's
    except (DeltaError, OSError) as error:
        raise ShownFailure(error.errno if isinstance(error, OSError) else None, shown(error)) from None

