"""Storage: fsspec paths, readers, sharded atomic writers and manifests."""
