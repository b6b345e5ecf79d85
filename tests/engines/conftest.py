"""tests/engines: one standalone Spark cluster shared by its cluster test modules (package scope)."""
from tests.spark_fixtures import shared_cluster, spark_cluster  # noqa: F401
