"""The deploy tests' fixtures: a real control service, router and agents on this machine
(the integration helpers), for the playbooks run against them."""

from tests.integration.conftest import cluster_factory, tiny_model  # noqa: F401
