"""Fixtures of the engine tests: a TCP forwarder that a test can kill and revive, standing in
for a second replica of one real vLLM server (its death: every connection cut, the port
refusing, under the test's control)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Callable, Iterator

import pytest


class KillableProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target_port`` until :meth:`kill`; :meth:`revive`
    listens on the same port again."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._server: asyncio.base_events.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self.revive()

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        self._writers -= {writer, up_writer}

    def revive(self) -> None:
        async def start() -> None:
            self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port,
                                                      reuse_address=True)  # fmt: skip

        self._run(start())

    def kill(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
                self._server = None
            for w in list(self._writers):
                w.transport.abort()  # connections cut mid-response, as a dead host does
            self._writers.clear()

        self._run(stop())

    def close(self) -> None:
        self.kill()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


@pytest.fixture()
def killable_proxy() -> Iterator[Callable[[int], KillableProxy]]:
    """``make(target_port) -> KillableProxy``; every proxy made is closed after the test."""
    made: list[KillableProxy] = []

    def make(port: int) -> KillableProxy:
        made.append(KillableProxy(port))
        return made[-1]

    yield make
    for proxy in made:
        proxy.close()


class FakeVLLM:
    """A vLLM server in-process, behind ``httpx.MockTransport``: what the vLLM engine talks to
    in server-free tests of its failure paths (the real server's behaviour is checked in
    ``test_vllm_engine.py``).

    It answers ``/v1/models`` (``root`` = a directory holding the test tokenizer, so the
    fingerprint check runs), the processed-log-prob probe, ``/health``, adapter load/unload,
    ``/collective_rpc`` and ``/v1/completions`` (streamed or not): every completion samples
    ``reply`` (ids) with log-prob ``-0.5`` each. Knobs: ``down`` (refuse connections),
    ``status`` (answer completions with this HTTP status), ``finish`` (the finish reason),
    ``chunks`` (raw stream lines to send instead), ``delay_s`` (per completion),
    ``fail_rpc`` (paths that answer 500), ``adapters`` and ``calls`` (what it was asked).
    Scoring: every prompt position and next-token candidate gets log-prob ``-0.25 / T`` at the
    request's temperature T; prompt log-probs are at T = 1 unless ``plugin`` (then at the
    ``vllm_xargs`` temperature, like clawrl's server plugin).
    """

    def __init__(self, url: str, root: str, reply: list[int]) -> None:
        self.url, self.root, self.reply = url, root, reply
        self.down = False
        self.status = 200
        self.finish = "length"
        self.chunks: list[str] | None = None
        self.delay_s = 0.0
        self.fail_rpc: set[str] = set()
        self.adapters: set[str] = set()
        self.calls: list[tuple[str, dict]] = []
        self.plugin = False

    async def handle(self, request):
        import httpx

        if self.down:
            raise httpx.ConnectError("connection refused", request=request)
        path = request.url.path
        body = json.loads(request.content) if request.content else {}
        self.calls.append((path, body))
        if path == "/health":
            return httpx.Response(200)
        if path == "/v1/models":
            data = [{"id": "base", "root": self.root, "max_model_len": 512, "parent": None}]
            data += [{"id": a, "root": a, "parent": "base"} for a in sorted(self.adapters)]
            return httpx.Response(200, json={"data": data})
        if path in self.fail_rpc:
            return httpx.Response(500, json={"error": {"message": "boom"}})
        if path == "/v1/load_lora_adapter":
            if body["lora_name"] in self.adapters and not body.get("load_inplace"):
                return httpx.Response(400, json={"error": {"message": "already loaded"}})
            self.adapters.add(body["lora_name"])
            return httpx.Response(200, text="ok")
        if path == "/v1/unload_lora_adapter":
            self.adapters.discard(body["lora_name"])
            return httpx.Response(200, text="ok")
        if path == "/collective_rpc":
            return httpx.Response(200, json={"results": [None]})
        assert path == "/v1/completions", path
        if body["model"] != "base" and body["model"] not in self.adapters:
            return httpx.Response(404, json={"error": {"message": "no such model"}})
        if body.get("prompt") == [1] and body.get("max_tokens") == 1 and "seed" in body:
            lp = -0.7 * body["temperature"]  # the mode probe: depends on the temperature
            return httpx.Response(200, json={"choices": [{"logprobs": {
                "token_logprobs": [lp], "top_logprobs": [{"token_id:5": lp}]}}]})  # fmt: skip
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.status != 200:
            return httpx.Response(self.status, json={"error": {"message": "server says no"}})
        if "prompt_logprobs" in body:
            xargs = body.get("vllm_xargs") or {}
            t = xargs.get("clawrl_prompt_temperature", 1.0) if self.plugin else 1.0
            entries = [None] + [{str(tok): {"logprob": -0.25 / t}} for tok in body["prompt"][1:]]
            return httpx.Response(200, json={"choices": [{
                "text": "x", "token_ids": [11], "finish_reason": "length",
                "prompt_logprobs": entries}]})  # fmt: skip
        if "logprob_token_ids" in body:
            lp = -0.25 / body["temperature"]
            return httpx.Response(200, json={"choices": [{
                "text": "x", "token_ids": [11], "finish_reason": "length",
                "logprobs": {"token_logprobs": [lp], "top_logprobs": [
                    {f"token_id:{c}": lp for c in body["logprob_token_ids"]}]}}]})  # fmt: skip
        ids = self.reply[: body["max_tokens"]]
        if not body.get("stream"):
            return httpx.Response(200, json={"choices": [{
                "text": "x", "token_ids": ids, "finish_reason": self.finish,
                "prompt_token_ids": body["prompt"],
                "logprobs": {"token_logprobs": [-0.5] * len(ids)}}]})  # fmt: skip
        lines = self.chunks
        if lines is None:
            lines = []
            for i, tok in enumerate(ids):
                last = i == len(ids) - 1
                lines.append("data: " + json.dumps({"choices": [{
                    "text": "x", "token_ids": [tok], "finish_reason": self.finish if last else None,
                    "prompt_token_ids": body["prompt"] if i == 0 else None,
                    "logprobs": {"token_logprobs": [-0.5]}}]}))  # fmt: skip
            lines.append("data: [DONE]")
        return httpx.Response(200, content=("\n\n".join(lines) + "\n\n").encode(),
                              headers={"content-type": "text/event-stream"})  # fmt: skip


@pytest.fixture()
def fake_vllm(tiny, tmp_path):
    """``make(n=1, plugin=False, **engine_kwargs) -> (VLLMEngine, [FakeVLLM, ...])``: fake
    replicas behind one transport (``plugin``: they act as if clawrl's server plugin ran); every
    engine made is closed after the test."""
    import httpx

    from clawrl.engine.vllm import VLLMEngine

    root = tmp_path / "model"
    tiny.tokenizer.save_pretrained(str(root))
    engines = []

    def make(n: int = 1, plugin: bool = False, **kwargs):
        servers = [FakeVLLM(f"http://replica{i}:8000", str(root), [11, 12, 13, 14])
                   for i in range(n)]  # fmt: skip
        for s in servers:
            s.plugin = plugin
        by_host = {s.url.split("//")[1].split(":")[0]: s for s in servers}

        async def route(request):
            return await by_host[request.url.host].handle(request)

        kwargs.setdefault("health_interval_s", 0.05)
        engine = VLLMEngine([s.url for s in servers], tiny.tokenizer,
                            transport=httpx.MockTransport(route), **kwargs)  # fmt: skip
        engines.append(engine)
        return engine, servers

    yield make
    for e in engines:
        e.close()


def trained_adapter(base, path, seed: int, *, rank: int = 8, scale: float = 0.02,
                    weights: str = "lora_B", **lora):  # fmt: skip
    """A LoRA adapter of ``base`` (a copy; ``base`` is untouched) whose ``weights`` parameters
    (``lora_B``: a trained adapter's; ``lora_``: A and B) are ``scale * N(0, 1)`` from
    ``seed``, saved to ``path``; returns the PEFT model in eval mode."""
    import copy

    import torch
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear",
                     task_type="CAUSAL_LM", **lora)  # fmt: skip
    model = get_peft_model(copy.deepcopy(base), cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if weights in name:
                p.copy_(scale * torch.randn(p.shape, generator=gen))
    model.save_pretrained(str(path))
    return model.eval()
