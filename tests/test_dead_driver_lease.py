"""Rerunning a job whose driver was killed does not wait out the object-store lease of the dead run,
but only when the lease provably belongs to a process of this host that is gone."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from datakit.io import publish
from tests.test_object_store import s3_endpoint  # noqa: F401


def _lease(pid: int, host: str) -> bytes:
    return json.dumps({"run": f"r{pid}", "pid": pid, "host": host, "since": "s",
                       "expires": time.time() + publish.LEASE_SECONDS}).encode()


def test_a_fresh_lease_of_a_dead_local_driver_is_taken_over(s3_endpoint):  # noqa: F811
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint})
    fs.mkdir("dead-driver")
    key, url = f"dead-driver/out/{publish.LOCK_NAME}", "s3://dead-driver/out"
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # a pid that existed on this host and is gone now
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for pid, host in ((alive.pid, socket.gethostname()), (gone.pid, "another-host")):
            fs.pipe_file(key, _lease(pid, host))
            with pytest.raises(publish.OutputBusyError, match="being written by another run"):
                publish._Lock(url).acquire_remote()
        fs.pipe_file(key, _lease(gone.pid, socket.gethostname()))
        lock = publish._Lock(url)
        lock.acquire_remote()
        fs.invalidate_cache()
        assert json.loads(fs.cat_file(key))["run"] == lock.owner["run"]
        lock.release_remote()
    finally:
        alive.kill()
        alive.wait()
