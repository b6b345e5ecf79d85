"""Storage faults: transient errors are retried with backoff inside the IO layer; the rest is one line.

Why here and not around each call site: every byte datakit moves on an object
store goes through s3fs (our readers, pyarrow's Parquet reads through fsspec,
the sinks), and s3fs runs every S3 request through one retry loop
(`s3fs.core._error_wrapper`, backoff `min(0.1 * 1.7**i, 15)` seconds). We make
that loop the only retry layer, bounded and logged:

* `s3fs.core.set_custom_error_handler` decides which errors are transient
  (HTTP 5xx, throttling codes, dropped connections) and logs each retry; s3fs
  retries throttling (`SlowDown`) and its own list of dropped-connection errors
  without asking the handler and says so only at DEBUG, so a filter on its logger
  (`_S3fsRetryLog`) logs those retries the same way;
* botocore's own retries are switched off by default (`fsspec.config`), so a
  request is not retried 5 x 5 times with two different backoffs;
* `S3FileSystem.retries` bounds the attempts (`DATAKIT_STORAGE_RETRIES`,
  default 12: at a 50% fault rate a request fails for good once in 4096);
* each attempt has a connect and a read timeout (`DATAKIT_STORAGE_TIMEOUT`
  seconds, default 30 to read, connecting at most 10 of them). Why not botocore's
  60 s each: an endpoint that accepts a request and never answers (a hung proxy,
  a stopped server) held a run for 12 attempts x 60 s per request with nothing but
  watchdog warnings; a timed-out attempt is transient, so it is retried like a
  503, and what still times out is one line, exit 3. The read timeout is the
  longest wait for the next bytes of a response, not for a whole transfer.

What is still failing after that is a `StorageError` whose message is one
line naming the path (the CLI exits 3). `describe()` also turns exceptions that
cannot cross a process boundary (aiohttp errors hold a `multidict`, which does
not pickle) into plain text, so a worker's storage error reaches the user as
what it was.
"""
from __future__ import annotations

import logging
import os

from datakit.errors import DatakitError

log = logging.getLogger("datakit.io.storage")

DEFAULT_RETRIES = 12
DEFAULT_TIMEOUT = 30.0  # seconds an attempt waits for the next bytes of a response
MAX_CONNECT_TIMEOUT = 10.0  # seconds an attempt waits for a connection (at most the read timeout)
_THROTTLE_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout",
                   "InternalError", "ServiceUnavailable", "503", "500", "502", "504"}


class StorageError(DatakitError, RuntimeError):
    """A read or write on storage failed for good (after retries). One line; the CLI exits 3."""


def retries() -> int:
    try:
        return max(1, int(os.environ.get("DATAKIT_STORAGE_RETRIES", DEFAULT_RETRIES)))
    except ValueError:
        return DEFAULT_RETRIES


def timeout() -> float:
    """Seconds an attempt waits for an answer (`DATAKIT_STORAGE_TIMEOUT`); a bad value is the default."""
    try:
        value = float(os.environ.get("DATAKIT_STORAGE_TIMEOUT", DEFAULT_TIMEOUT))
    except ValueError:
        return DEFAULT_TIMEOUT
    return value if value > 0 else DEFAULT_TIMEOUT


def client_config() -> dict:
    """botocore `Config` arguments of every S3 client datakit makes: no retries of botocore's own
    (s3fs's loop is the one retry layer), bounded connect and read waits."""
    wait = timeout()
    return {"retries": {"mode": "standard", "total_max_attempts": 1},
            "connect_timeout": min(wait, MAX_CONNECT_TIMEOUT), "read_timeout": wait}


def is_transient(e: BaseException) -> bool:
    """A fault worth retrying: the service said "later" (5xx, throttling) or the connection broke."""
    resp = getattr(e, "response", None)
    if isinstance(resp, dict):  # botocore ClientError
        status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        code = str(resp.get("Error", {}).get("Code", ""))
        return status >= 500 or code in _THROTTLE_CODES
    name = type(e).__name__
    mod = type(e).__module__ or ""
    if mod.startswith(("aiohttp", "botocore")) and ("Connect" in name or "Timeout" in name or "Payload" in name
                                                    or "Disconnected" in name or "ServerError" in name):
        return True
    return isinstance(e, (ConnectionError, TimeoutError))


def _retry_handler(e: BaseException) -> bool:
    transient = is_transient(e)
    if transient:
        _log_retry(e)
    return transient


def _log_retry(e: BaseException) -> None:
    """The one line a retry is logged with (our handler's and s3fs's own, `_S3fsRetryLog`)."""
    log.info("storage: transient %s, retrying with backoff", short_reason(e))


# s3fs's own retries (`_error_wrapper`): errors it retries without calling the custom handler, and
# the DEBUG messages it logs for them
_S3FS_SELF_RETRIED = ("SlowDown", "reduce your request rate", "XAmzContentSHA256Mismatch")
_S3FS_RETRY_MESSAGES = ("Retryable error: %s", "Client error (maybe retryable): %s")


class _S3fsRetryLog(logging.Filter):
    """On the `s3fs` logger: log each retry s3fs makes on its own, like `_retry_handler` does.

    Why: throttling is the most common fault of a busy bucket, and it was retried silently (a run
    under 85% injected faults sometimes ended "after up to 3 attempts" with no retry in its log).
    The logger is lowered to DEBUG so s3fs makes those records; every other record passes only
    at the level the logger would have had (its parent's), so nothing else becomes visible.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg in _S3FS_RETRY_MESSAGES and record.args:
            e = record.args[0] if isinstance(record.args, tuple) else None
            if isinstance(e, BaseException) and (record.msg == _S3FS_RETRY_MESSAGES[0]
                                                 or any(p in str(e) for p in _S3FS_SELF_RETRIED)):
                _log_retry(e)
        return record.levelno >= logging.getLogger("s3fs").parent.getEffectiveLevel()


def _log_s3fs_own_retries() -> None:
    """Install `_S3fsRetryLog` once; leave a user's own level on the s3fs logger alone."""
    s3fs_log = logging.getLogger("s3fs")
    if not any(isinstance(f, _S3fsRetryLog) for f in s3fs_log.filters):
        s3fs_log.addFilter(_S3fsRetryLog())
    if s3fs_log.level == logging.NOTSET:
        s3fs_log.setLevel(logging.DEBUG)


def short_reason(e: BaseException) -> str:
    """`ServiceUnavailable (HTTP 503)`-style text: the error class and code, never a payload."""
    resp = getattr(e, "response", None)
    if isinstance(resp, dict):
        code = resp.get("Error", {}).get("Code", "")
        status = resp.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return f"{code or type(e).__name__}" + (f" (HTTP {status})" if status else "")
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text[:200]}" if text else type(e).__name__


def describe(e: BaseException, path: str, what: str = "access") -> StorageError:
    """One picklable line for a failed storage operation on `path`."""
    cause = e.__cause__ or e.__context__
    if is_disk_full(e):  # what an operator must do is free space there: say so first
        return StorageError(f"storage error: no space left on the device to {what} {path}: {short_reason(e)}")
    reason = short_reason(e)
    if cause is not None and getattr(cause, "response", None) is not None:
        reason = short_reason(cause)
    # only a transient fault was retried: local disks never are, and a refusal (no credentials,
    # access denied, no such bucket) fails on its first attempt
    transient = is_transient(e) or (cause is not None and is_transient(cause))
    retried = f" (after up to {retries()} attempts)" if "://" in path and transient else ""
    return StorageError(f"storage error: cannot {what} {path}: {reason}{retried}")


def is_disk_full(e: BaseException) -> bool:
    """No space left on a device (errno 28), as Python, pyarrow or polars (a `ComputeError` whose
    text carries the OS error) report it."""
    if isinstance(e, OSError) and e.errno == 28:
        return True
    text = str(e)
    return "No space left on device" in text or "os error 28" in text or "[errno 28]" in text.lower()


def from_storage_stack(e: BaseException) -> bool:
    """Raised by a storage library (botocore, aiohttp, s3fs, fsspec), or a full disk: never our code's own."""
    return (type(e).__module__ or "").startswith(("botocore", "aiobotocore", "aiohttp", "s3fs", "fsspec")) \
        or is_disk_full(e)


def is_store_refusal(e: BaseException) -> bool:
    """The store refused or failed the request (a wrong key, a bucket one may not read, the endpoint
    down), as opposed to the data being wrong: s3fs raises an HTTP 403 as the built-in PermissionError,
    which `from_storage_stack` cannot tell by its module, so it counts here too."""
    return isinstance(e, PermissionError) or from_storage_stack(e)


def is_storage_error(e: BaseException) -> bool:
    """Errors that come from the storage stack (not from our code or the data)."""
    if isinstance(e, StorageError):
        return False
    if from_storage_stack(e):
        return True
    return isinstance(e, OSError) and not isinstance(e, (FileNotFoundError, IsADirectoryError, NotADirectoryError))


def configure() -> None:
    """Install the retry policy for this process (`datakit.io.fs` runs it before its first fsspec filesystem).

    Importing s3fs costs ~0.25 CPU-s and ~50 MB (aiobotocore, aiohttp) in every process, and most
    runs never touch an object store. So unless s3fs is already loaded, the `s3`/`s3a` protocols are
    pointed at `datakit.io.s3_fs`, which imports s3fs and installs the policy on first use.
    """
    import sys

    if "s3fs.core" in sys.modules:
        install()
        return
    from fsspec.registry import known_implementations, register_implementation, registry

    for proto in ("s3", "s3a"):
        if proto not in registry and known_implementations.get(proto, {}).get("class") == "s3fs.S3FileSystem":
            register_implementation(proto, "datakit.io.s3_fs.S3FileSystem", clobber=True,
                                    errtxt="Install s3fs to access S3")


def install() -> None:
    """Set s3fs's error handler, retry count and botocore's retry config (idempotent)."""
    try:
        import fsspec.config
        import s3fs.core
    except ImportError:  # no s3fs: nothing to configure
        return
    s3fs.core.set_custom_error_handler(_retry_handler)
    _log_s3fs_own_retries()
    s3fs.core.S3FileSystem.retries = retries()
    conf = fsspec.config.conf.setdefault("s3", {})
    conf.setdefault("config_kwargs", client_config())  # a user's own config_kwargs are kept whole
