"""The embedded engine (pyarrow + polars + a process pool), one module per concern.

- `engine.py`     the driver: walks the plan, fuses chains, materializes, runs barriers, sink, commit
- `scheduler.py`  worker count (small-input rule) and mapping tasks over the kept pool
- `chain.py`      the worker side: one fused chain over one partition, spilled, with its counters
- `spill.py`      partitions and spill files (Parquet parts, Arrow IPC shard streams)
- `barriers.py`   polars joins/aggregates and core's connected components over spilled parts
- `broadcast.py`  the per-process cache of broadcast-join right sides
- `memory.py`     malloc_trim every 256 MB of input and after each task (bounded RSS on long streams)
"""
from datakit.engines.local.engine import LocalEngine
from datakit.engines.local.scheduler import EngineError

__all__ = ["LocalEngine", "EngineError"]
