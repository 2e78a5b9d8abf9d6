"""The router in front of a disaggregated replica: prefill on one worker, decode on another.

Run it as ``python -m fleetsieve_bayes.backends.router --port P --prefill URL
[URL…] --decode URL [URL…]`` (the vLLM backend starts one per disaggregated
replica, under the same lifeline as its workers). It serves

- ``POST /v1/completions`` and ``POST /v1/chat/completions``: the request goes
  first to a prefill worker (round robin) with ``max_tokens = 1`` (and
  ``max_completion_tokens = 1`` where given), ``stream`` false, no
  ``stream_options``, ``min_tokens`` dropped, and ``kv_transfer_params``
  asking for a remote decode; then the original request goes to a decode
  worker (round robin), with the ``kv_transfer_params`` the prefill answered
  with (NIXL's handshake: which blocks to pull from where; connectors that
  need none answer none), and the decode worker's response is streamed back
  as it comes. Both requests carry the same ``X-Request-Id``. A prefill that
  fails is answered with the worker's own status and body (a request error
  stays a request error); a worker that cannot be reached is a 502 naming it;
  a decode worker that breaks mid-stream breaks the client's stream.
- ``GET /health``: 200 when every worker's ``/health`` is 200, else 503 with
  each worker's status (``null``: no answer).

This is the protocol of vLLM's own example proxies
(``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``, the
disaggregated-serving examples), which are scripts, not an installable module,
and pull in FastAPI and httpx; llm-d's router needs Kubernetes. This one needs
only aiohttp, which the package already depends on (docs/measuring.md,
"Disaggregated configurations").
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import uuid
from collections.abc import Sequence
from typing import Any

import aiohttp
from aiohttp import web

__all__ = ["COMPLETION_ROUTES", "prefill_request", "decode_request", "make_app", "main"]

COMPLETION_ROUTES: tuple[str, ...] = ("/v1/completions", "/v1/chat/completions")
# What a prefill request asks of the KV connector: compute the prompt's KV cache here and
# keep it for a decode worker to take (the fields vLLM's NIXL proxy sends).
PREFILL_KV_PARAMS: dict[str, Any] = {
    "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
    "remote_block_ids": None, "remote_host": None, "remote_port": None,
}
HEALTH_TIMEOUT_S = 5.0


def prefill_request(body: dict[str, Any]) -> dict[str, Any]:
    """The prefill worker's request: one output token, not streamed, asking for a remote decode."""
    out = dict(body)
    out["kv_transfer_params"] = dict(PREFILL_KV_PARAMS)
    out["stream"] = False
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    for key in ("stream_options", "min_tokens", "min_completion_tokens"):
        out.pop(key, None)
    return out


def decode_request(body: dict[str, Any], prefilled: Any) -> dict[str, Any]:
    """The decode worker's request: the original, with the prefill's ``kv_transfer_params`` if any."""
    out = dict(body)
    params = prefilled.get("kv_transfer_params") if isinstance(prefilled, dict) else None
    if params:
        out["kv_transfer_params"] = params
    return out


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"object": "error", "message": message, "type": "RouterError", "code": status},
                             status=status)


class _Router:
    """The workers, their round-robin turns and the one client session to them."""

    def __init__(self, prefill: Sequence[str], decode: Sequence[str]) -> None:
        self.prefill = [u.rstrip("/") for u in prefill]
        self.decode = [u.rstrip("/") for u in decode]
        self.next_prefill = itertools.cycle(self.prefill)
        self.next_decode = itertools.cycle(self.decode)
        self.session: aiohttp.ClientSession | None = None

    async def open(self, _: web.Application) -> None:
        # No pool limit and no total timeout: the load generator times its own requests.
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                             timeout=aiohttp.ClientTimeout(total=None))

    async def close(self, _: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    async def _status(self, url: str) -> int | None:
        assert self.session is not None
        try:
            async with self.session.get(url + "/health", timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)) as r:
                return r.status
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None

    async def health(self, _: web.Request) -> web.Response:
        urls = [*self.prefill, *self.decode]
        statuses = await asyncio.gather(*(self._status(u) for u in urls))
        if all(s == 200 for s in statuses):
            return web.Response(status=200)
        return web.json_response({"status": "unhealthy", "workers": dict(zip(urls, statuses, strict=True))},
                                 status=503)

    async def complete(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "body is not JSON")
        if not isinstance(body, dict):
            return _error(400, "body is not a JSON object")
        headers = {"X-Request-Id": request.headers.get("X-Request-Id") or uuid.uuid4().hex}
        if "Authorization" in request.headers:
            headers["Authorization"] = request.headers["Authorization"]
        prefill, decode = next(self.next_prefill), next(self.next_decode)
        assert self.session is not None
        try:
            async with self.session.post(prefill + request.path, json=prefill_request(body), headers=headers) as r:
                data = await r.read()
                if r.status != 200:  # the worker's own answer: a bad request stays one
                    return web.Response(status=r.status, body=data, content_type=r.content_type)
            prefilled = json.loads(data)
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            return _error(502, f"prefill worker {prefill}: {type(exc).__name__}: {exc}")
        return await self._stream(request, decode, decode_request(body, prefilled), headers)

    async def _stream(self, request: web.Request, decode: str, body: dict[str, Any],
                      headers: dict[str, str]) -> web.StreamResponse:
        assert self.session is not None
        resp: web.StreamResponse | None = None
        try:
            async with self.session.post(decode + request.path, json=body, headers=headers) as r:
                resp = web.StreamResponse(status=r.status,
                                          headers={"Content-Type": r.headers.get("Content-Type", "application/json")})
                await resp.prepare(request)
                async for chunk in r.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except (aiohttp.ClientError, OSError) as exc:
            if resp is None:
                return _error(502, f"decode worker {decode}: {type(exc).__name__}: {exc}")
            raise  # mid-stream: the client's stream breaks, as the worker's did


def make_app(prefill: Sequence[str], decode: Sequence[str]) -> web.Application:
    """The router's application for these workers' base URLs."""
    if not prefill or not decode:
        raise ValueError("a router needs at least one prefill and one decode worker")
    router = _Router(prefill, decode)
    app = web.Application(client_max_size=64 * 1024**2)
    app.on_startup.append(router.open)
    app.on_cleanup.append(router.close)
    app.router.add_get("/health", router.health)
    for route in COMPLETION_ROUTES:
        app.router.add_post(route, router.complete)
    return app


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fleetsieve_bayes.backends.router",
                                description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--prefill", nargs="+", required=True, metavar="URL", help="prefill workers' base URLs")
    p.add_argument("--decode", nargs="+", required=True, metavar="URL", help="decode workers' base URLs")
    args = p.parse_args(argv)
    print(f"router: prefill {' '.join(args.prefill)}; decode {' '.join(args.decode)}", flush=True)
    print(f"router: listening on http://{args.host}:{args.port}", flush=True)
    web.run_app(make_app(args.prefill, args.decode), host=args.host, port=args.port, print=None, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
