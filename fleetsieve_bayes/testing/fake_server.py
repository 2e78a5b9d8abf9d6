"""A fake OpenAI-compatible completions server that behaves like a serving engine under load.

Run it as ``python -m fleetsieve_bayes.testing.fake_server --port P --slots N
--token-delay S``. It serves ``GET /health`` (503 until ready, then 200),
``GET /v1/models`` and ``POST /v1/completions`` (streaming SSE or not).

Timing model (what tests compare measurements with): the engine has
``slots`` sequence slots (``--max-num-seqs``); a request waits FIFO for a
slot, then its k-th output token (k = 1..max_tokens) is emitted at
``start + prefill + k × step`` where ``start`` is when it got its slot,
``prefill = prefill_delay_per_token × prompt length`` and ``step`` the
per-token delay. The step does not depend on how many slots are busy
(continuous batching with a fixed step time), so at a prompt/output mix with
mean service time ``S = prefill + L × step`` the capacity is ``slots / S``
req/s, and beyond it a queue builds up and TTFT/completion tails grow.

``--tp T`` makes tensor parallelism matter: the step is divided by
``T ** tp_speedup`` and, with ``--tp-slots``, the slots are multiplied by T.

Failure switches mimic vLLM's failure modes: ``--die-at-start`` (exit 1
before serving), ``--oom-at-start`` (print a CUDA out-of-memory traceback,
exit 1), ``--never-healthy`` (``/health`` stays 503), ``--die-after N`` (the
process exits abruptly when request N+1 arrives, mid-stream for the
in-flight ones), ``--spawn-worker`` (a child process in the same process
group, like vLLM's workers), ``--ignore-sigterm`` (only SIGKILL stops it),
``--error-every N`` (every N-th completion request is answered HTTP 500 while
the others are served normally), ``--reject-flag=FLAG`` (exit 2 with an
argparse error when FLAG is on the command line, as a vLLM without that engine
argument does). ``--fault-role ROLE`` confines the failure switches to the
server whose ``--kv-transfer-config`` has ``kv_role`` ROLE (``none``: the one
without), so that one role of a disaggregated replica fails.

Disaggregation: ``--kv-transfer-config JSON`` is accepted (invalid JSON is an
argparse error) and recorded. A request carrying ``kv_transfer_params`` with
``do_remote_decode`` (a prefill) is answered, as vLLM's NIXL prefill is, with
``kv_transfer_params`` for the decode request (``do_remote_prefill``), by
a server with a ``--kv-transfer-config`` only (without one, vLLM answers
none and the decode worker computes the prompt again). ``GET /debug`` reports the command line, the slots, the KV-transfer
configuration and what was received (counts of ``max_tokens``, streamed
requests, prefills and remote-prefilled decodes); ``--log-requests`` prints
one line per completion request to the log.
It binds 127.0.0.1 by default and never talks to anything else.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from aiohttp import web

OOM_MESSAGE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. "
    "GPU 0 has a total capacity of 79.19 GiB of which 1.02 GiB is free."
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fake_server", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="fake-model", help="served model name (requests must match)")
    p.add_argument("--slots", "--max-num-seqs", dest="slots", type=int, default=8,
                   help="engine sequence slots (max concurrent sequences; vLLM's --max-num-seqs)")
    p.add_argument("--token-delay", type=float, default=0.01, help="seconds per output token (decode step)")
    p.add_argument("--prefill-delay-per-token", type=float, default=0.0, help="seconds per prompt token")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree (see --tp-speedup, --tp-slots)")
    p.add_argument("--tp-speedup", type=float, default=0.0, help="step is divided by tp ** this")
    p.add_argument("--tp-slots", action="store_true", help="multiply the slots by tp (more KV cache)")
    p.add_argument("--max-model-len", type=int, default=0, help="reject prompt+max_tokens above this (0: no limit)")
    p.add_argument("--vocab-size", type=int, default=0,
                   help="reject prompt token ids >= this, as vLLM does (0: no check)")
    p.add_argument("--startup-delay", type=float, default=0.0, help="seconds of /health 503 before ready")
    p.add_argument("--die-at-start", action="store_true")
    p.add_argument("--oom-at-start", action="store_true")
    p.add_argument("--never-healthy", action="store_true")
    p.add_argument("--die-after", type=int, default=0, help="exit abruptly when request N+1 arrives (0: never)")
    p.add_argument("--error-every", type=int, default=0,
                   help="answer every N-th completion request with HTTP 500 (0: never)")
    p.add_argument("--spawn-worker", action="store_true", help="start a child process in the same group")
    p.add_argument("--ignore-sigterm", action="store_true")
    # /metrics with vLLM's names and buckets (testing/fake_metrics.py), and its failure injection.
    p.add_argument("--metrics-missing", default="", help="comma-separated vLLM metric names to leave out")
    p.add_argument("--metrics-legacy-names", action="store_true",
                   help="expose vllm:gpu_cache_usage_perc (before its rename to kv_cache_usage_perc)")
    p.add_argument("--metrics-reset-after", type=int, default=0,
                   help="zero every counter once N requests have finished (an engine restart)")
    p.add_argument("--not-vllm-metrics", action="store_true", help="serve a /metrics without vllm:* series")
    p.add_argument("--abort-every", type=int, default=0,
                   help="every N-th request ends without [DONE], counted finished_reason=abort (0: never)")
    # Disaggregated serving (a prefill or decode worker behind a router).
    p.add_argument("--kv-transfer-config", type=_kv_config, default=None,
                   help="vLLM's KV-transfer configuration (JSON), recorded; kv_role names this server's role")
    p.add_argument("--fault-role", default="",
                   help="apply the failure switches only when kv_role is this ('none': no KV-transfer config)")
    p.add_argument("--reject-flag", action="append", default=[],
                   help="exit 2 with an argparse error when this flag is given (as a vLLM lacking it does)")
    p.add_argument("--log-requests", action="store_true", help="print one line per completion request")
    args, unknown = p.parse_known_args(argv)  # tolerate vLLM-style extra args
    given = list(sys.argv[1:] if argv is None else argv)
    for flag in args.reject_flag:
        if any(a == flag or a.startswith(flag + "=") for a in given):
            p.error(f"unrecognized arguments: {flag}")  # exits 2, as vLLM's parser does
    args.argv = given
    if args.fault_role and args.fault_role != kv_role(args):
        for switch in ("die_at_start", "oom_at_start", "never_healthy", "ignore_sigterm"):
            setattr(args, switch, False)
        args.die_after = args.error_every = args.abort_every = 0
    return args


def _kv_config(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return value


def kv_role(args: argparse.Namespace) -> str:
    """This server's ``kv_role`` (``"none"`` without a KV-transfer configuration)."""
    return str((args.kv_transfer_config or {}).get("kv_role", "none"))


class _State:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ready_at = time.monotonic() + args.startup_delay
        self.step = args.token_delay / (args.tp ** args.tp_speedup)
        self.n_slots = args.slots * (args.tp if args.tp_slots else 1)
        self.slots = asyncio.Semaphore(self.n_slots)
        self.received = 0
        self.completed = 0
        self.running = 0
        # What /debug reports of the requests: max_tokens → count, and the disaggregation traffic.
        self.max_tokens: dict[int, int] = {}
        self.streamed = 0
        self.prefills = 0  # requests asking for a remote decode (a router's prefill)
        self.remote_prefilled = 0  # requests carrying a prefill's kv_transfer_params (a decode)
        from fleetsieve_bayes.testing.fake_metrics import FakeMetrics

        self.metrics = FakeMetrics(
            args.model, missing=[m for m in args.metrics_missing.split(",") if m],
            legacy_names=args.metrics_legacy_names, reset_after=args.metrics_reset_after,
            kv_slots=self.n_slots,
        )

    def note(self, body: dict[str, Any], max_tokens: int, stream: bool) -> dict[str, Any] | None:
        """Count a request; the ``kv_transfer_params`` its answer carries (a prefill's), else None."""
        self.max_tokens[max_tokens] = self.max_tokens.get(max_tokens, 0) + 1
        self.streamed += stream
        params = body.get("kv_transfer_params")
        if self.args.log_requests:
            print(f"request max_tokens={max_tokens} stream={stream} kv_transfer_params={json.dumps(params)}",
                  flush=True)
        if not isinstance(params, dict):
            return None
        if params.get("do_remote_prefill"):
            self.remote_prefilled += 1
        if not params.get("do_remote_decode") or self.args.kv_transfer_config is None:
            return None  # as vLLM without a KV connector: the decode worker recomputes the prompt
        self.prefills += 1
        return {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": f"fake-{self.args.port}",
                "remote_block_ids": [self.prefills], "remote_host": self.args.host, "remote_port": self.args.port}

    def debug(self) -> dict[str, Any]:
        return {"argv": self.args.argv, "model": self.args.model, "slots": self.n_slots,
                "kv_transfer_config": self.args.kv_transfer_config, "received": self.received,
                "completed": self.completed, "max_tokens": {str(k): v for k, v in sorted(self.max_tokens.items())},
                "streamed": self.streamed, "prefills": self.prefills, "remote_prefilled": self.remote_prefilled}


def _error(status: int, message: str) -> web.Response:
    body = {"object": "error", "message": message, "type": "BadRequestError", "code": status}
    return web.json_response(body, status=status)


async def _sleep_until(t: float) -> None:
    # Deadline-based sleeps, so per-token overheads do not accumulate.
    delay = t - asyncio.get_running_loop().time()
    if delay > 0:
        await asyncio.sleep(delay)


def _check_request(args: argparse.Namespace, body: dict[str, Any]) -> tuple[int, int] | web.Response:
    """A completion request's ``(prompt tokens, max_tokens)``, or the error vLLM answers it with."""
    if body.get("model") != args.model:
        return _error(404, f"The model `{body.get('model')}` does not exist.")
    prompt = body.get("prompt", "")
    n_in = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
    max_tokens = int(body.get("max_tokens") or 16)
    if max_tokens < 1:
        return _error(400, "max_tokens must be at least 1")
    if args.vocab_size and isinstance(prompt, list):
        bad = [t for t in prompt if not isinstance(t, int) or not 0 <= t < args.vocab_size]
        if bad:
            return _error(400, f"Token id {bad[0]} is out of vocabulary")
    if args.max_model_len and n_in + max_tokens > args.max_model_len:
        return _error(400, f"This model's maximum context length is {args.max_model_len} tokens.")
    return n_in, max_tokens


class _Completion:
    """One completion request being served (what the handler writes, token by token)."""

    def __init__(self, state: _State, request: web.Request, number: int, n_in: int, max_tokens: int,
                 stream: bool, kv_params: dict[str, Any] | None) -> None:
        self.state, self.request, self.n_in, self.max_tokens, self.stream = state, request, n_in, max_tokens, stream
        self.kv_params = kv_params
        self.created = int(time.time())
        self.id = f"cmpl-{number}"
        self.aborts = bool(state.args.abort_every) and number % state.args.abort_every == 0

    def chunk(self, k: int) -> bytes:
        chunk = {"id": self.id, "object": "text_completion", "created": self.created, "model": self.state.args.model,
                 "choices": [{"index": 0, "text": " tok", "logprobs": None,
                              "finish_reason": "length" if k == self.max_tokens else None}]}
        return f"data: {json.dumps(chunk)}\n\n".encode()

    async def serve(self) -> web.StreamResponse:
        state, loop = self.state, asyncio.get_running_loop()
        arrived = loop.time()
        state.metrics.waiting += 1
        async with state.slots:
            state.metrics.waiting -= 1
            state.running += 1
            try:
                start = loop.time() + state.args.prefill_delay_per_token * self.n_in
                resp: web.StreamResponse
                if self.stream:
                    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                    await resp.prepare(self.request)
                for k in range(1, self.max_tokens + 1):
                    await _sleep_until(start + k * state.step)
                    if k == 1:
                        first_at = loop.time()
                    if self.stream:
                        await resp.write(self.chunk(k))
                if self.aborts:  # the engine aborted it: the client gets no clean end
                    state.metrics.finish(first_at - arrived, loop.time() - arrived, reason="abort")
                    if not self.stream:
                        return _error(500, "request aborted by the engine")
                    await resp.write(b'data: {"error": {"message": "request aborted by the engine"}}\n\n')
                    await resp.write_eof()
                    return resp
                state.completed += 1
                state.metrics.finish(first_at - arrived, loop.time() - arrived)
                return await self.finish(resp if self.stream else None)
            finally:
                state.running -= 1

    async def finish(self, resp: web.StreamResponse | None) -> web.StreamResponse:
        usage = {"prompt_tokens": self.n_in, "completion_tokens": self.max_tokens,
                 "total_tokens": self.n_in + self.max_tokens}
        model = self.state.args.model
        if resp is None:
            body: dict[str, Any] = {
                "id": self.id, "object": "text_completion", "created": self.created, "model": model,
                "choices": [{"index": 0, "text": " tok" * self.max_tokens, "finish_reason": "length"}],
                "usage": usage,
            }
            if self.kv_params is not None:
                body["kv_transfer_params"] = self.kv_params
            return web.json_response(body)
        final: dict[str, Any] = {"id": self.id, "object": "text_completion", "created": self.created,
                                 "model": model, "choices": [], "usage": usage}
        await resp.write(f"data: {json.dumps(final)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


def make_app(args: argparse.Namespace) -> web.Application:
    state = _State(args)

    async def health(_: web.Request) -> web.Response:
        if args.never_healthy or time.monotonic() < state.ready_at:
            return web.Response(status=503, text="engine not ready")
        return web.Response(status=200)

    async def models(_: web.Request) -> web.Response:
        entry: dict[str, Any] = {"id": args.model, "object": "model", "root": args.model}
        if args.max_model_len:
            entry["max_model_len"] = args.max_model_len  # as vLLM reports it
        return web.json_response({"object": "list", "data": [entry]})

    async def metrics(_: web.Request) -> web.Response:
        if args.not_vllm_metrics:
            return web.Response(text=f"# TYPE http_requests_total counter\nhttp_requests_total {state.received}\n")
        return web.Response(text=state.metrics.render(state.running),
                            content_type="text/plain", charset="utf-8")

    async def debug(_: web.Request) -> web.Response:
        return web.json_response(state.debug())

    async def completions(request: web.Request) -> web.StreamResponse:
        state.received += 1
        number = state.received
        if args.die_after and state.received > args.die_after:
            os._exit(3)  # abrupt: in-flight streams break, like an engine crash
        if args.error_every and state.received % args.error_every == 0:
            return _error(500, "injected error (--error-every)")
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "body is not JSON")
        checked = _check_request(args, body)
        if isinstance(checked, web.Response):
            return checked
        n_in, max_tokens = checked
        stream = bool(body.get("stream", False))
        kv_params = state.note(body, max_tokens, stream)
        return await _Completion(state, request, number, n_in, max_tokens, stream, kv_params).serve()

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/debug", debug)
    app.router.add_post("/v1/completions", completions)
    return app


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.spawn_worker:
        # Stays in our process group, like vLLM's tensor-parallel workers.
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    print(f"fake server: loading model {args.model} (tp={args.tp}, max_num_seqs={args.slots}, "
          f"kv_role={kv_role(args)})", flush=True)
    print(f"fake server: argv {json.dumps(args.argv)}", flush=True)
    if args.oom_at_start:
        print(OOM_MESSAGE, file=sys.stderr, flush=True)
        return 1
    if args.die_at_start:
        print("RuntimeError: Engine core initialization failed.", file=sys.stderr, flush=True)
        return 1
    print(f"fake server: listening on http://{args.host}:{args.port}", flush=True)
    web.run_app(make_app(args), host=args.host, port=args.port, print=None,
                handle_signals=not args.ignore_sigterm, access_log=None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
