"""`datakit report` on an object store that refuses the request (a wrong secret key: HTTP 403).

Found in an operations review: s3fs turns a 403 into Python's `PermissionError`, which `report` did not
expect, so the command said `report failed unexpectedly (PermissionError); this is a bug, please report
it ...` where `validate`, `forget` and `run` on the same folder give one storage-error line, exit 3.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

_DENIED = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SignatureDoesNotMatch</Code>'
           b'<Message>The request signature we calculated does not match</Message></Error>')


class _Refuses(BaseHTTPRequestHandler):
    """An S3 endpoint that answers every request 403, as S3 does for a wrong secret key."""

    def _deny(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        self.send_response(403)
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", "0" if self.command == "HEAD" else str(len(_DENIED)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(_DENIED)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _deny

    def log_message(self, *args) -> None:
        pass


@pytest.mark.parametrize("args", [
    ["report", "s3://datasets/out"],
    # the same review: diff and build-index said exit 2 (a usage error) for the same refusal
    ["diff", "s3://datasets/out", "s3://datasets/out"],
    ["build-index", "s3://datasets/out", "--workers", "1"],
])
def test_a_refusing_object_store_is_one_storage_error_line_exit_3(tmp_path, args):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Refuses)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    secret = "WrongSecretKeyDoNotPrint0123456789"
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "AKIAREVIEWREVIEW0000", "AWS_SECRET_ACCESS_KEY": secret,
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.server_port}",
           "TMPDIR": str(tmp_path), "DATAKIT_STORAGE_RETRIES": "1"}
    try:
        r = subprocess.run([sys.executable, "-m", "datakit.cli", *args], env=env,
                           capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 3, r.stderr
    assert len(lines) == 1 and lines[0].startswith("datakit: error: storage error: "), r.stderr
    assert "s3://datasets/out" in lines[0] and "this is a bug" not in r.stderr
    assert secret not in r.stderr + r.stdout
    assert not list(tmp_path.glob("datakit-error-*"))  # no traceback file for an expected failure
