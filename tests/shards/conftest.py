"""The data tests' shard fixtures, for the shard tools' tests."""

from tests.data.conftest import fmnist_shards  # noqa: F401 - a fixture, found by name
