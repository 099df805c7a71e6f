"""The FastAPI app of the OpenAI door, and uvicorn running it on the router's own event loop.

GET  /v1/models            the served model
POST /v1/completions       prompt -> text (stream: true for SSE ending in `data: [DONE]`)
POST /v1/chat/completions  messages -> the model's chat template -> text
GET  /health               200 when the router takes requests, else 503 (as vLLM's)
GET  /metrics              the router's Prometheus registry (also on --metrics-port)

Under the router's --tls-cert the door serves HTTPS only, with the same certificate, and under
--tls-client-ca it demands a client certificate that CA signed, as the gRPC port does. It cannot
check --tls-allowed-clients (uvicorn does not hand the peer's certificate to the app), so the
router refuses that pair unless --http-port is 0 (`check_http_door`).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import ssl
from collections.abc import Callable, Iterator
from typing import Any

import prometheus_client
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from pdserve.core.sampling_params import InvalidRequestError
from pdserve.core.serving.tls import ServerTls
from pdserve.core.text.chat import chat_prompt
from pdserve.router import metrics
from pdserve.router.admission import Admission
from pdserve.router.clock import Deadline
from pdserve.router.errors import RouterError
from pdserve.router.http.door import Call, answer
from pdserve.router.http.errors import UnknownModelError, api_error, on_validation_error
from pdserve.router.http.responses import Endpoint
from pdserve.router.http.schemas import ChatCompletionRequest, CompletionRequest
from pdserve.router.tenants import tenant_of


def build_app(admission: Admission, ready: Callable[[], bool]) -> FastAPI:
    """`ready`: whether the router takes requests now (model loaded, workers up, not draining)."""
    app = FastAPI(title="pdserve", docs_url=None, redoc_url=None)
    app.add_exception_handler(RequestValidationError, on_validation_error)

    @app.get("/health")
    async def health() -> Response:
        return Response(status_code=200 if ready() else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        page = prometheus_client.generate_latest(prometheus_client.REGISTRY)
        return Response(page, media_type=prometheus_client.CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models() -> Response:
        try:
            limits = admission.loaded_validator().limits
        except RouterError as error:
            return api_error(error).response()
        card = {
            "id": limits.model_name,
            "object": "model",
            "owned_by": "pdserve",
            "max_model_len": limits.max_position,
        }
        return JSONResponse({"object": "list", "data": [card]})

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, http: Request) -> Response:
        return await _answer(http, admission, Endpoint.COMPLETIONS, body)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, http: Request) -> Response:
        return await _answer(http, admission, Endpoint.CHAT, body)

    return app


async def _answer(
    http: Request,
    admission: Admission,
    endpoint: Endpoint,
    body: CompletionRequest | ChatCompletionRequest,
) -> Response:
    try:
        model = _served_model(admission, body.model)
        if isinstance(body, ChatCompletionRequest):
            request = body.to_generate_request(_chat_prompt(admission, body))
        else:
            request = body.to_generate_request()
    except (InvalidRequestError, RouterError) as error:
        refusal = api_error(error, body.params())
        metrics.REQUESTS.labels(endpoint.value, refusal.code.name).inc()
        return refusal.response()
    timeout = admission.config.http_request_timeout_seconds
    deadline = Deadline.after(timeout or None)
    tenant = tenant_of(admission.tenants, list(http.headers.items()), ())
    call = Call(
        admission, endpoint, model, request, body.params(), deadline, body.include_usage, tenant
    )
    return await answer(http, call, body.stream)


def _served_model(admission: Admission, requested: str) -> str:
    served = admission.loaded_validator().limits.model_name
    if requested != served:
        raise UnknownModelError(requested, served)
    return served


def _chat_prompt(admission: Admission, body: ChatCompletionRequest) -> str:
    tokenizer = admission.loaded_validator().tokenizer
    try:
        return chat_prompt(tokenizer, body.chat_messages())
    except ValueError as error:  # transformers: the model has no chat template
        raise InvalidRequestError("messages", str(error)) from error


class _EmbeddedServer(uvicorn.Server):
    """uvicorn inside the router's loop: the router's ServiceHost owns SIGTERM and SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpDoor:
    """The app served on its own port, as a task on the running loop (beside grpc.aio)."""

    def __init__(
        self, app: FastAPI, host: str, port: int, drain_seconds: float, tls: ServerTls | None
    ) -> None:
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=math.ceil(drain_seconds),
            **_ssl_settings(tls),
        )
        self._server = _EmbeddedServer(config)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        # Bound here, not by uvicorn, so a taken port is an OSError at start-up, not sys.exit.
        self._socket = socket.create_server((host, port), family=family)
        self._task: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        return int(self._socket.getsockname()[1])

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._server.serve([self._socket]))

    async def stop(self) -> None:
        """Stops taking connections; open ones get the drain time to finish."""
        if self._task is not None:
            self._server.should_exit = True
            await self._task


def check_http_door(http_port: int, tls: ServerTls | None) -> None:
    """Refuses a door that would be more open than the gRPC port beside it."""
    if http_port != 0 and tls is not None and tls.allowed_clients:
        raise ValueError(
            "--tls-allowed-clients: the HTTP door cannot check names on client certificates; "
            "set --http-port 0 (or drop --tls-allowed-clients)"
        )


def _ssl_settings(tls: ServerTls | None) -> dict[str, Any]:
    """uvicorn's TLS settings for the router's server TLS (none: plaintext)."""
    if tls is None:
        return {}
    settings: dict[str, Any] = {"ssl_certfile": str(tls.cert), "ssl_keyfile": str(tls.key)}
    if tls.client_ca is not None:
        settings |= {"ssl_ca_certs": str(tls.client_ca), "ssl_cert_reqs": ssl.CERT_REQUIRED}
    return settings
