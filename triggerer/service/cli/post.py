"""``triggerer post BROKER TARGET MESSAGE...``: send messages to a broker through the ``send``
of the provider named ``BROKER``, to fire pipelines. The providers say which they are; the
parser lists none of them, so one installed from another package posts as the built-in ones."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from triggerer.service.cli.output import quiet_client_logs, say
from triggerer.service.cli.store import CliError
from triggerer.service.cli.verbs import verb

if TYPE_CHECKING:
    import argparse

    from triggerer.service.config import Settings


def add_verbs(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    post = verb(verbs, "post", _post, "send messages to a broker, to fire pipelines")
    post.add_argument(
        "broker",
        metavar="BROKER",
        help="the provider's name: kafka, sqs, nats, rabbitmq, ... (docs/providers)",
    )
    post.add_argument(
        "target",
        metavar="TARGET",
        help="the queue's URI, as MessageQueueTrigger takes it; for kafka a topic, for sqs a "
        "queue name or URL",
    )
    post.add_argument(
        "messages", nargs="+", metavar="MESSAGE", help="message bodies: JSON or text, as given"
    )
    post.add_argument("--connection", help="the [connections.NAME] holding credentials")
    kafka = post.add_argument_group("kafka")
    kafka.add_argument("--bootstrap-servers", help="for a topic name (127.0.0.1:9092)")
    kafka.add_argument("--key", help="the record's key")
    sqs = post.add_argument_group("sqs")
    sqs.add_argument("--endpoint-url", help="for a queue name: a local endpoint")
    sqs.add_argument("--region", help="for a queue name (us-east-1)")


async def _post(_: Settings, arguments: argparse.Namespace) -> int:
    """Send the messages through the named provider's ``send``, to the queue ``TARGET`` names."""
    from watchers import providers

    by_name = {
        provider.name: provider for provider in providers.installed() if provider.send is not None
    }
    provider = by_name.get(arguments.broker)
    if provider is None or provider.send is None:
        raise CliError(
            f"no provider named {arguments.broker!r} sends messages; "
            f"triggerer post sends to {', '.join(sorted(by_name))}"
        )
    uri, shown, options = _ADDRESSES.get(provider.name, _uri_address)(arguments)
    if not provider.schemes or uri.partition(":")[0].lower() not in provider.schemes:
        raise CliError(
            f"{uri!r} is not a {provider.name} URI ({', '.join(provider.schemes)}): see "
            f"docs/providers for each provider's URI form"
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
    for option, owner in _OWNED_OPTIONS.items():
        if getattr(arguments, option) is not None:
            flag = "--" + option.replace("_", "-")
            raise CliError(
                f"{flag} is an option of `post {owner}`, not of `post {arguments.broker}`"
            )
    return arguments.target, arguments.target, {}


def _kafka_address(arguments: argparse.Namespace) -> Address:
    """``post kafka TOPIC --bootstrap-servers HOST:PORT,...``: a ``kafka://`` URI (a URI as it
    is)."""
    if "://" in arguments.target:
        return arguments.target, arguments.target, {"key": arguments.key}
    servers = arguments.bootstrap_servers or "127.0.0.1:9092"
    for server in servers.split(","):
        host, colon, port = server.rpartition(":") if ":" in server else (server, "", "")
        if not host or (colon and not (port.isdigit() and 1 <= int(port) <= 65_535)):
            raise CliError(
                "--bootstrap-servers must be HOST:PORT[,HOST:PORT...] with ports from 1 to "
                f"65535, got {servers!r}"
            )
    return f"kafka://{servers}/{arguments.target}", arguments.target, {"key": arguments.key}


def _sqs_address(arguments: argparse.Namespace) -> Address:
    """``post sqs QUEUE``: a queue URL or URI as it is, a name as an ``sqs://`` URI."""
    queue = arguments.target
    uri = queue if "://" in queue else f"sqs://{queue}"
    options = {
        "endpoint_url": arguments.endpoint_url,
        "region_name": arguments.region or "us-east-1",
    }
    return uri, queue, options


_ADDRESSES = {"kafka": _kafka_address, "sqs": _sqs_address}
"""The providers whose ``post`` also takes a plain topic or queue name, with its options."""
_OWNED_OPTIONS = {
    "bootstrap_servers": "kafka",
    "key": "kafka",
    "endpoint_url": "sqs",
    "region": "sqs",
}
"""The options of those providers' ``post``, by their ``argparse`` names."""
