pytest_plugins = [
    "tests.fixtures.database",
    "tests.fixtures.brokers",
    "tests.fixtures.spark",
    "tests.fixtures.postgres_cluster",
]
