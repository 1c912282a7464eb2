"""``triggerer post``: send messages to a broker through its provider's ``send``, to fire
pipelines."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from triggerer.service.cli.output import quiet_client_logs, say
from triggerer.service.cli.store import CliError
from triggerer.service.cli.verbs import verb

if TYPE_CHECKING:
    import argparse

    from triggerer.service.config import Settings


def add_verbs(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    post = verbs.add_parser("post", help="send messages to fire pipelines")
    targets = post.add_subparsers(metavar="BROKER")
    kafka = verb(targets, "kafka", _post, "produce to a Kafka topic")
    kafka.set_defaults(provider="kafka", address=_kafka_address, connection=None)
    kafka.add_argument("topic")
    kafka.add_argument("messages", nargs="+", help="JSON values or text")
    kafka.add_argument("--bootstrap-servers", default="127.0.0.1:9092")
    kafka.add_argument("--key")
    sqs = verb(targets, "sqs", _post, "send to an SQS queue")
    sqs.set_defaults(provider="sqs", address=_sqs_address, connection=None)
    sqs.add_argument("queue", help="queue URL or name")
    sqs.add_argument("messages", nargs="+", help="JSON values or text")
    sqs.add_argument("--endpoint-url")
    sqs.add_argument("--region", default="us-east-1")
    for name, where in POST_TARGETS.items():
        target = verb(targets, name, _post, f"send to {where}")
        target.set_defaults(provider=name, address=_uri_address)
        target.add_argument("uri", help="the queue's URI, as MessageQueueTrigger takes it")
        target.add_argument("messages", nargs="+", help="message bodies: JSON or text, as given")
        target.add_argument("--connection", help="the [connections.NAME] holding credentials")


POST_TARGETS = {
    "nats": "a NATS JetStream subject",
    "redis-streams": "a Redis stream",
    "redis-pubsub": "a Redis pub/sub channel",
    "rabbitmq": "a RabbitMQ queue",
    "pubsub": "the topic of a Google Pub/Sub subscription",
    "kinesis": "an Amazon Kinesis stream",
    "mqtt": "an MQTT topic",
}
"""``triggerer post NAME``: the providers (by name) whose ``send`` it calls, and what to."""


async def _post(_: Settings, arguments: argparse.Namespace) -> int:
    """Send the messages through the named provider's ``send``, to the queue ``address``
    makes of the verb's arguments."""
    from watchers import providers

    uri, shown, options = arguments.address(arguments)
    scheme = uri.partition(":")[0].lower()
    try:
        provider = providers.for_scheme(scheme)
    except ValueError as error:
        raise CliError(str(error)) from None
    if provider is None or provider.name != arguments.provider or provider.send is None:
        raise CliError(
            f"{uri!r} is not a {arguments.provider} URI: see docs/architecture.md "
            "for each provider's URI form"
        )
    quiet_client_logs()
    try:
        sent = await provider.send(uri, arguments.messages, arguments.connection, **options)
    except (LookupError, ValueError, ConnectionError) as error:
        raise CliError(str(error)) from None
    say(f"sent {len(sent)} message(s) to {shown}")
    return 0


Address = tuple[str, str, dict[str, Any]]
"""What ``post`` sends to: the queue's URI, the name it prints, the provider's ``send`` options."""


def _uri_address(arguments: argparse.Namespace) -> Address:
    return arguments.uri, arguments.uri, {}


def _kafka_address(arguments: argparse.Namespace) -> Address:
    """``post kafka TOPIC --bootstrap-servers HOST:PORT,...``: a ``kafka://`` URI."""
    servers = arguments.bootstrap_servers
    for server in servers.split(","):
        host, colon, port = server.rpartition(":") if ":" in server else (server, "", "")
        if not host or (colon and not (port.isdigit() and 1 <= int(port) <= 65_535)):
            raise CliError(
                "--bootstrap-servers must be HOST:PORT[,HOST:PORT...] with ports from 1 to "
                f"65535, got {servers!r}"
            )
    return f"kafka://{servers}/{arguments.topic}", arguments.topic, {"key": arguments.key}


def _sqs_address(arguments: argparse.Namespace) -> Address:
    """``post sqs QUEUE``: a queue URL as it is, a name as an ``sqs://`` URI."""
    queue = arguments.queue
    uri = queue if "://" in queue else f"sqs://{queue}"
    options = {"endpoint_url": arguments.endpoint_url, "region_name": arguments.region}
    return uri, queue, options
