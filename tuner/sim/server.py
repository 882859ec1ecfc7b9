"""OpenAI-compatible streaming server whose token timing comes from the simulator (serve-sim).

Endpoints: ``/v1/completions`` (prompt as text or token ids; SSE streaming with ``usage`` and
``prompt_tokens_details.cached_tokens`` when ``stream_options.include_usage``), ``/generate``
(SGLang native), ``/health``, ``/server_info`` (SGLang-shaped), ``/v1/models``.
Faults for reliability tests: exit_at_start, crash_after_s=N, hang, hang_after_s=N, oom, slow_start_s=N.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import zlib

from aiohttp import web

from tuner.errors import ConfigError

from .online import OnlineEngine

FAULTS = ("exit_at_start", "crash_after_s", "hang", "hang_after_s", "oom", "slow_start_s")


def parse_fault(text: str | None) -> tuple[str | None, float]:
    if not text:
        return None, 0.0
    name, _, value = text.partition("=")
    if name not in FAULTS:
        raise ConfigError(f"unknown fault {text!r}; valid: exit_at_start, crash_after_s=N, hang, hang_after_s=N, "
                          "oom, slow_start_s=N", key="fault")
    if name in ("crash_after_s", "hang_after_s", "slow_start_s"):
        try:
            return name, float(value)
        except ValueError:
            raise ConfigError(f"{name} needs a number of seconds, e.g. {name}=5", key="fault") from None
    return name, 0.0


def tokenize(text: str, vocab: int) -> list[int]:
    """Deterministic one-id-per-word tokenizer (stable across runs and processes)."""
    return [zlib.crc32(w.encode()) % (vocab - 10) + 10 for w in text.split()] or [0]


def oom_message(plan) -> str:
    return (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        f"{plan.pre_model_load_gb / 1.073741824:.2f} GiB of which 0 bytes is free. {plan.reason}\n"
    )


class SimServer:
    def __init__(self, engine: OnlineEngine, plan, *, model_name: str, server_args: dict, fault=(None, 0.0),
                 time_scale: float = 1.0):
        self.engine, self.plan = engine, plan
        self.model_name = model_name
        self.server_args = server_args
        self.fault, self.fault_value = fault
        self.time_scale = time_scale
        self.ready_at = 0.0
        self.started = time.monotonic()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/generate", self.generate)
        app.router.add_get("/health", self.health)
        app.router.add_get("/health_generate", self.health)
        app.router.add_get("/server_info", self.server_info)
        app.router.add_get("/get_server_info", self.server_info)
        app.router.add_get("/v1/models", self.models)
        app.on_startup.append(self._startup)
        return app

    async def _startup(self, app):
        loop = asyncio.get_running_loop()
        delay = self.fault_value / self.time_scale if self.fault == "slow_start_s" else 0.0
        self.ready_at = time.monotonic() + delay
        self._engine_task = loop.create_task(self.engine.run())
        if self.fault == "hang":
            loop.call_later(delay, setattr, self.engine, "hung", True)
        if self.fault == "hang_after_s":  # answers, then stops producing tokens mid-run
            loop.call_later(delay + self.fault_value / self.time_scale, setattr, self.engine, "hung", True)
        if self.fault == "crash_after_s":
            loop.call_later(delay + self.fault_value / self.time_scale, self._crash)

    def _crash(self):
        sys.stderr.write("Fatal Python error: Segmentation fault (simulated crash)\n")
        sys.stderr.flush()
        os._exit(134)

    def _ready(self) -> bool:
        return time.monotonic() >= self.ready_at

    async def health(self, request):
        if not self._ready():
            return web.Response(status=503, text="starting")
        if self.engine.hung:
            await asyncio.sleep(min(20.0, 20.0 / self.time_scale))
            return web.Response(status=503, text="health check timed out")
        return web.Response(status=200)

    async def models(self, request):
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "owned_by": "tuner-serve-sim",
             "max_model_len": self.plan.context_length}]})

    async def server_info(self, request):
        p = self.plan
        per_rank = {
            "effective_max_running_requests_per_dp": p.max_running_requests_per_dp_rank,
            "last_gen_throughput": self.engine.last_gen_throughput,
            # SGLang reports these in GiB (bytes / 2**30) though it labels them GB
            "memory_usage": {"weight": round(p.weights_gb_per_gpu * 1e9 / 2**30, 3),
                             "kvcache": round(p.kv_cache_gb_per_gpu * 1e9 / 2**30, 3),
                             "token_capacity": p.kv_capacity_tokens_per_gpu},
        }
        return web.json_response({
            **self.server_args,
            "enable_dp_attention": p.attn_dp_size > 1,
            "max_total_num_tokens": p.kv_capacity_tokens_per_gpu,
            "max_req_input_len": p.max_req_input_len,
            "internal_states": [dict(per_rank) for _ in range(p.kv_pools)],
            "version": f"{p.sglang_version}-sim",
        })

    def _prompt_ids(self, body) -> list[int] | web.Response:
        prompt = body.get("input_ids", body.get("prompt", body.get("text")))
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return tokenize(prompt, self.engine.vocab)
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return prompt
        return web.json_response({"error": {"message": "prompt must be a string or a list of token ids"}},
                                 status=400)

    async def completions(self, request):
        if not self._ready():
            return web.json_response({"error": {"message": "server is starting"}}, status=503)
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"error": {"message": "invalid JSON"}}, status=400)
        ids = self._prompt_ids(body)
        if isinstance(ids, web.Response):
            return ids
        if len(ids) > self.plan.max_req_input_len:
            return web.json_response({"error": {"message": f"The input ({len(ids)} tokens) is longer than the "
                                                f"model's context length ({self.plan.max_req_input_len} tokens)."}},
                                     status=400)
        max_tokens = int(body.get("max_tokens") or 16)
        req = self.engine.submit(ids, max_tokens, ignore_eos=bool(body.get("ignore_eos", True)))
        created = int(time.time())
        usage_wanted = bool((body.get("stream_options") or {}).get("include_usage"))
        if not body.get("stream"):
            tokens = await self._collect(req)
            return web.json_response({
                "id": req.rid, "object": "text_completion", "created": created, "model": self.model_name,
                "choices": [{"index": 0, "text": "".join(f" t{t}" for t in tokens), "finish_reason": "length"}],
                "usage": self._usage(req, len(tokens))})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        n = 0
        while True:
            tok = await req.handle.get()
            if tok is None:
                break
            n += 1
            chunk = {"id": req.rid, "object": "text_completion", "created": created, "model": self.model_name,
                     "choices": [{"index": 0, "text": f" t{tok}", "token_ids": [tok],
                                  "finish_reason": "length" if n >= req.output_len else None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        if usage_wanted:
            final = {"id": req.rid, "object": "text_completion", "created": created, "model": self.model_name,
                     "choices": [], "usage": self._usage(req, n)}
            await resp.write(f"data: {json.dumps(final)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def generate(self, request):
        if not self._ready():
            return web.json_response({"error": "server is starting"}, status=503)
        body = await request.json()
        ids = self._prompt_ids(body)
        if isinstance(ids, web.Response):
            return ids
        params = body.get("sampling_params") or {}
        req = self.engine.submit(ids, int(params.get("max_new_tokens") or 16),
                                 ignore_eos=bool(params.get("ignore_eos", True)))
        meta = lambda n: {"id": req.rid, "prompt_tokens": req.input_len, "completion_tokens": n,
                          "cached_tokens": (req.cached or 0), "finish_reason": {"type": "length"}}
        if not body.get("stream"):
            tokens = await self._collect(req)
            return web.json_response({"text": "".join(f" t{t}" for t in tokens), "output_ids": tokens,
                                      "meta_info": meta(len(tokens))})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        out: list[int] = []
        while True:
            tok = await req.handle.get()
            if tok is None:
                break
            out.append(tok)
            data = {"text": "".join(f" t{t}" for t in out), "output_ids": list(out), "meta_info": meta(len(out))}
            await resp.write(f"data: {json.dumps(data)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def _collect(self, req) -> list[int]:
        out = []
        while True:
            tok = await req.handle.get()
            if tok is None:
                return out
            out.append(tok)

    def _usage(self, req, n: int) -> dict:
        return {"prompt_tokens": req.input_len, "completion_tokens": n,
                "total_tokens": req.input_len + n,
                "prompt_tokens_details": {"cached_tokens": (req.cached or 0)}}
