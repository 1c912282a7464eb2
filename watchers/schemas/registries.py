"""Fetching a writer's schema by its id: from a registry speaking Confluent's REST API (over
httpx), or from AWS Glue Schema Registry (over aiobotocore). I/O only: what a schema becomes is
:mod:`watchers.schemas.decoders`'s.

A fetch that finds no such schema raises :class:`SchemaNotFound` (the message naming it is a
dead letter); a registry that does not answer, times out or answers a server error raises
:class:`RegistryUnavailable` (retried); a registry that refuses the daemon (unauthorised, a
malformed answer, a 404 that is not Confluent's "not found" of a schema, subject or version: a
wrong URL) raises :class:`RegistryRefused` (the watcher's error).

Each fetch opens a client of its own and closes it: a daemon fetches each schema once, so a
pool of connections kept open would serve nothing but the first messages.
"""

from __future__ import annotations

import base64
import binascii
import urllib.parse
from typing import Any, Protocol

import httpx
from botocore.exceptions import BotoCoreError, ClientError

from watchers import aws
from watchers.schemas.decoders import AVRO, JSON, PROTOBUF, WriterSchema

#: How long one request to a registry may take before it counts as not answering.
REQUEST_TIMEOUT_S = 10.0
#: References deeper than this are a loop, not a schema.
MAX_REFERENCE_DEPTH = 32
#: The ``error_code`` of a 404 by which Confluent's API says what a request names is not there:
#: a schema id (``GET /schemas/ids/{id}``), a subject or a version (``GET /subjects/...``). Any
#: other 404 (a proxy's, a wrong path prefix's) says nothing of the schema.
_ID_NOT_FOUND_CODES = frozenset({40403})
_VERSION_NOT_FOUND_CODES = frozenset({40401, 40402})
_TRANSIENT_GLUE_CODES = frozenset(
    {"ThrottlingException", "InternalServiceException", "ServiceUnavailableException"}
)


class RegistryError(Exception):
    """A registry that cannot serve the schema now: not the message's fault. Not an
    ``OSError``, so that no provider takes it for its broker's connection failing."""


class RegistryUnavailable(RegistryError):
    """The registry does not answer, times out, or answers a server error: tried again."""


class RegistryRefused(RegistryError):
    """The registry refuses the daemon (credentials, permissions) or answers what is not a
    schema: the watcher's error until its settings change."""


class SchemaNotFound(LookupError):
    """The registry holds no schema of the message's id."""


class Registry(Protocol):
    """Where a kind of registry's schemas come from."""

    #: Names the registry in messages (its URL, or Glue's region and endpoint).
    name: str

    async def fetch(self, schema_id: int | str, *, schema_type: str) -> WriterSchema:
        """The schema of ``schema_id``; ``schema_type`` is the type the trigger expects (a
        registry may serve each type in a form of its own)."""
        ...


class ConfluentRegistry:
    """A registry speaking Confluent's REST API at ``url``: ``GET /schemas/ids/{id}`` and, for
    the schemas it refers to, ``GET /subjects/{subject}/versions/{version}``. Protobuf schemas
    are asked for as serialized descriptors (``format=serialized``), so the daemon needs no
    ``.proto`` compiler. ``username``/``password`` are sent as HTTP basic auth (Confluent
    Cloud's API key and secret), ``token`` as a bearer token."""

    def __init__(
        self,
        url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        token: str | None = None,
        ssl_cafile: str | None = None,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.name = url
        self._url = url.rstrip("/")
        self._auth = None if username is None else httpx.BasicAuth(username, password or "")
        self._headers = {"Accept": "application/vnd.schemaregistry.v1+json, application/json"}
        if token is not None:
            self._headers["Authorization"] = f"Bearer {token}"
        self._verify: str | bool = ssl_cafile or True
        self._timeout_s = timeout_s

    async def fetch(self, schema_id: int | str, *, schema_type: str) -> WriterSchema:
        params = {"format": "serialized"} if schema_type == PROTOBUF else {}
        async with httpx.AsyncClient(
            auth=self._auth,
            headers=self._headers,
            verify=self._verify,
            timeout=self._timeout_s,
        ) as client:
            answer = await self._get(
                client, f"/schemas/ids/{schema_id}", params, _ID_NOT_FOUND_CODES
            )
            if answer is None:
                raise SchemaNotFound(f"schema id {schema_id} is not in the registry at {self.name}")
            return await self._schema(client, answer, params, depth=0)

    async def _schema(
        self, client: httpx.AsyncClient, answer: Any, params: dict[str, str], *, depth: int
    ) -> WriterSchema:
        if not isinstance(answer, dict) or not isinstance(answer.get("schema"), str):
            raise RegistryRefused(
                f"the registry at {self.name} answered no schema: {answer!r:.200}"
            )
        schema_type = answer.get("schemaType", AVRO)
        text: str = answer["schema"]
        schema: str | bytes = text
        if schema_type == PROTOBUF and params:
            try:
                schema = base64.b64decode(text, validate=True)
            except binascii.Error:
                raise RegistryRefused(
                    f"the registry at {self.name} answered a Protobuf schema that is not base64 "
                    "with format=serialized"
                ) from None
        listed = answer.get("references") or []
        if not isinstance(listed, list):
            raise RegistryRefused(
                f"the registry at {self.name} answered references that are not a list: "
                f"{listed!r:.200}"
            )
        references = [
            await self._reference(client, reference, params, depth=depth + 1)
            for reference in listed
        ]
        return WriterSchema(schema_type, schema, tuple(references))

    async def _reference(
        self, client: httpx.AsyncClient, reference: Any, params: dict[str, str], *, depth: int
    ) -> tuple[str, WriterSchema]:
        if depth > MAX_REFERENCE_DEPTH:
            raise RegistryRefused(
                f"the registry at {self.name} answered schema references over "
                f"{MAX_REFERENCE_DEPTH} deep (a loop?)"
            )
        try:
            name, subject, version = reference["name"], reference["subject"], reference["version"]
        except (TypeError, KeyError):
            raise RegistryRefused(
                f"the registry at {self.name} answered a malformed reference: {reference!r:.200}"
            ) from None
        path = f"/subjects/{urllib.parse.quote(str(subject), safe='')}/versions/{version}"
        answer = await self._get(
            client, path, {"deleted": "true", **params}, _VERSION_NOT_FOUND_CODES
        )
        if answer is None:
            raise SchemaNotFound(
                f"schema reference {name!r} (subject {subject!r}, version {version}) is not in "
                f"the registry at {self.name}"
            )
        return str(name), await self._schema(client, answer, params, depth=depth)

    async def _get(
        self,
        client: httpx.AsyncClient,
        path: str,
        params: dict[str, str],
        not_found: frozenset[int],
    ) -> Any:
        """The JSON answer of ``GET path``; ``None`` for a 404 whose ``error_code`` is one of
        ``not_found``."""
        try:
            response = await client.get(self._url + path, params=params)
        except httpx.TransportError as error:
            raise RegistryUnavailable(
                f"schema registry at {self.name} does not answer: {type(error).__name__}: {error}"
            ) from None
        status = response.status_code
        if status == httpx.codes.NOT_FOUND:
            if _error_code(response) in not_found:
                return None
            raise RegistryRefused(
                f"schema registry at {self.name} answered GET {path} with a 404 that is not "
                f"Confluent's schema, subject or version not found ({response.text[:200]}): is "
                "the URL the registry's, with its path prefix if any?"
            )
        if status >= httpx.codes.INTERNAL_SERVER_ERROR or status == httpx.codes.TOO_MANY_REQUESTS:
            raise RegistryUnavailable(
                f"schema registry at {self.name} answered {status}: {response.text[:200]}"
            )
        if status != httpx.codes.OK:
            raise RegistryRefused(
                f"schema registry at {self.name} refused GET {path}: {status} {response.text[:200]}"
            )
        try:
            return response.json()
        except ValueError:
            raise RegistryRefused(
                f"schema registry at {self.name} answered GET {path} with what is not JSON"
            ) from None


def _error_code(response: httpx.Response) -> int | None:
    """The ``error_code`` of an answer in Confluent's error form, ``None`` in another."""
    try:
        answer = response.json()
    except (ValueError, RecursionError):
        return None
    code = answer.get("error_code") if isinstance(answer, dict) else None
    return code if isinstance(code, int) else None


class GlueRegistry:
    """AWS Glue Schema Registry: ``GetSchemaVersion`` by the schema version id a message names
    (which is unique across registries, so no registry name is needed). ``options`` are the
    Glue client's: ``region_name``, ``endpoint_url`` and credentials."""

    def __init__(self, options: dict[str, Any]) -> None:
        self._options = options
        where = options.get("endpoint_url") or options.get("region_name") or "the default region"
        self.name = f"AWS Glue Schema Registry ({where})"

    async def fetch(self, schema_id: int | str, *, schema_type: str) -> WriterSchema:
        try:
            async with aws.session().create_client("glue", **self._options) as glue:
                answer = await glue.get_schema_version(SchemaVersionId=str(schema_id))
        except ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if code == "EntityNotFoundException":
                raise SchemaNotFound(f"schema version {schema_id} is not in {self.name}") from None
            if status >= httpx.codes.INTERNAL_SERVER_ERROR or code in _TRANSIENT_GLUE_CODES:
                raise RegistryUnavailable(f"{self.name} answered {code}: {error}") from None
            raise RegistryRefused(f"{self.name} refused GetSchemaVersion: {error}") from None
        except BotoCoreError as error:
            raise RegistryUnavailable(f"{self.name} does not answer: {error}") from None
        data_format = answer.get("DataFormat", "")
        schema_types = {"AVRO": AVRO, "JSON": JSON, "PROTOBUF": PROTOBUF}
        if data_format not in schema_types:
            raise RegistryRefused(f"{self.name} answered an unknown DataFormat {data_format!r}")
        return WriterSchema(schema_types[data_format], str(answer["SchemaDefinition"]))
