"""fsspec's `s3://` implementation, reached only when a path on S3 is first used (see storage.configure).

Why a module: s3fs is heavy to import, so datakit registers this module path for the `s3` and
`s3a` protocols instead of importing s3fs in every process; importing it installs the retry
policy (datakit/io/storage.py) before the first S3 filesystem is made.
"""
from __future__ import annotations

from s3fs import S3FileSystem

from datakit.io import storage

storage.install()

__all__ = ["S3FileSystem"]
