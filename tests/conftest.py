pytest_plugins = [
    "tests.fixtures.database",
    "tests.fixtures.brokers",
    "tests.fixtures.kinesis",
    "tests.fixtures.pubsub",
    "tests.fixtures.mqtt",
    "tests.fixtures.spark",
    "tests.fixtures.postgres_cluster",
    "tests.fixtures.nats",
    "tests.fixtures.redis",
    "tests.fixtures.rabbitmq",
    "tests.fixtures.airflow",
    "tests.fixtures.otlp",
    "tests.fixtures.schema_registry",
    "tests.fixtures.pipeline_files",
    # Last: it imports the modules above, which pytest must load first (to rewrite asserts).
    "tests.fixtures.services",
]
