"""In-process generation on a transformers causal LM, with continuous batching.

One engine thread owns the model. Requests from any thread or asyncio loop are queued; the
engine thread admits them between decode steps (prefill, then they join the running batch), so
a request that arrives while others decode does not wait for them to finish. The running batch
shares one KV cache, left-padded so that every row ends at the same position: rows join by
padding the shorter side and leave by index selection, and all-padding columns are trimmed.

Batching modes (``engine.batching``):

* ``"continuous"``: models whose layers all attend over keys and values (full attention, sliding
  windows, or a mix: Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3). The engine's cache keeps every
  layer as a plain, never-evicting ``DynamicLayer`` (sliding-window layers too), each
  ``[B, heads, L, head_dim]``. The model's mask functions then build each sliding-window mask
  from column distances; since every row is left-padded and ends at the same column, the
  distance between two columns of a row is the distance between its tokens, so the windows are
  exact. The price: a sliding layer holds the whole context (at most ``max_context``), not only
  its window.
* ``"serial"``: any other model (linear-attention / convolution / Mamba-style states, KV sharing,
  chunked attention, a cache class of its own) -- the states cannot be padded and stacked, so
  requests are decoded one at a time on the model's own cache (an effective ``max_batch`` of 1),
  and a warning says so once. :func:`config_blocker` decides from the config when the engine is
  built; :func:`cache_blocker` checks every prefilled cache, and the engine turns serial if one
  cannot join the batch.

Per-request adapters (a user's LoRA, ``SamplingParams.adapter``): :meth:`load_adapter` loads a
PEFT adapter under a name; rows of different adapters, and rows without one, decode in the same
batch, each adapter added unmerged to its own rows only (:mod:`clawrl.engine.row_adapters`).
A newer version of an adapter serves the next request at once (no stall); rows finish on the
version they started with.

Policy versions: :meth:`TransformersEngine.load_policy` queues new weights; the engine stops
admitting new requests, lets the rows in flight finish on the version they started with, swaps
the weights between two decode steps, then admits the queued requests on the new version. No
request is refused during a swap; it waits at most for the rows in flight.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import EllipsisType
from typing import Any

import torch

from clawrl.engine import inputs
from clawrl.engine.lora import MergedLora, UnsupportedAdapter, lora_deltas
from clawrl.engine.row_adapters import AdapterKey, RowAdapters
from clawrl.engine.sampling import is_greedy, processed_logprobs, sample_rows
from clawrl.engine.types import (
    Completion,
    EngineStats,
    FinishReason,
    InProcessFacts,
    SamplingParams,
    TokenEvent,
)
from clawrl.errors import EngineClosedError, EngineError

log = logging.getLogger(__name__)

CONTINUOUS = "continuous"
"""``engine.batching``: requests join and leave one shared, left-padded KV cache."""
SERIAL = "serial"
"""``engine.batching``: one request decodes at a time (the model's cache cannot be merged)."""
_PLAIN_LAYER_TYPES = frozenset({"full_attention", "sliding_attention"})


@dataclass
class _GenRequest:
    prompt_ids: list[int]
    params: SamplingParams
    emit: _LoopEmitter
    max_new: int
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)
    joined: bool = False  # its row is in the running batch (which releases its adapter)


@dataclass
class _ScoreRequest:
    items: list[tuple[list[int], list[int]]]
    temperature: float
    future: concurrent.futures.Future[list[list[float]]]
    base: bool = False
    candidates: list[int] | None = None  # next-token mode: log-probs of these ids only


@dataclass
class _SwapRequest:
    version: int
    weights: Any
    future: concurrent.futures.Future[int]


@dataclass
class _AdapterRequest:
    name: str
    version: int | None  # None: unload
    path: Path | None
    future: concurrent.futures.Future[Any]


@dataclass
class _Row:
    req: _GenRequest
    version: int
    adapter: AdapterKey | None = None
    generated: list[int] = field(default_factory=list)
    real_len: int = 0  # tokens in the cache that belong to this row (prompt + generated)
    generator: torch.Generator | None = None
    stop_ids: frozenset[int] = frozenset()
    pending: TokenEvent | None = None  # the event of the token sampled this step


_Item = _GenRequest | _ScoreRequest | _SwapRequest | _AdapterRequest


class TransformersEngine(InProcessFacts):
    """Token-level engine on a ``transformers`` causal LM (the default backend).

    Args:
        model: a causal LM (e.g. ``load_policy(...).model``); the engine puts it in eval mode
            and owns it from now on (other threads must not run it).
        eos_token_ids: ids that always end a completion (unless ``ignore_eos``).
        max_context: the context window in tokens (prompt + completion).
        max_batch: most rows decoded together.
        policy_version: version of the initial weights.
        decode_text: ``ids -> str``, needed only for stop strings (usually ``tokenizer.decode``).
        tokenizer_id: the fingerprint of the tokenizer the ids belong to
            (:func:`clawrl.models.tokenizer_fingerprint`; ``from_policy`` sets it).
        max_adapters: most per-request adapters held in memory (:meth:`load_adapter`); the
            least recently used beyond it are dropped and reloaded from disk when asked for.

    Attributes:
        batching: ``"continuous"`` (:data:`CONTINUOUS`: up to ``max_batch`` rows decode together)
            or ``"serial"`` (:data:`SERIAL`: the model's cache cannot be merged, one row at a
            time); see the module doc.

    All public methods are thread-safe; the async ones may be called from any event loop.
    """

    def __init__(
        self,
        model: Any,
        *,
        eos_token_ids: Sequence[int],
        max_context: int,
        max_batch: int = 32,
        policy_version: int = 0,
        decode_text: Callable[[list[int]], str] | None = None,
        tokenizer_id: str = "",
        max_adapters: int = 8,
    ) -> None:
        self.model = model.eval()
        self.tokenizer_id = tokenizer_id
        self.eos_token_ids = frozenset(int(i) for i in eos_token_ids)
        self.max_context = int(max_context)
        self.max_batch = int(max_batch)
        self.policy_version = int(policy_version)
        self.decode_text = decode_text
        self.stats = EngineStats()
        self._device = next(model.parameters()).device
        # transformers >= 5.2x names the KV-cache argument ``cache`` (``past_key_values`` before)
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.batching: str = CONTINUOUS
        if (why := config_blocker(getattr(model, "config", None))) is not None:
            self._go_serial(why)
        self._lora = MergedLora(self.model)  # LoRA versions are served as merged weights
        self.adapters = RowAdapters(self.model, max_adapters)  # per-request (users') adapters
        self._inbox: queue.Queue[_Item | None] = queue.Queue()
        self._waiting: list[_GenRequest] = []
        self._scores: list[_ScoreRequest] = []
        self._swaps: list[_SwapRequest] = []
        self._adapter_ops: list[_AdapterRequest] = []
        self._rows: list[_Row] = []
        self._cache: Any = None  # DynamicCache of the running batch
        self._mask: torch.Tensor | None = None  # [B, L] 1 = real token, 0 = left padding
        self._last: torch.Tensor | None = None  # [B] last sampled token of each row
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="clawrl-engine", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public API

    @classmethod
    def from_policy(cls, policy: Any, **kwargs: Any) -> TransformersEngine:
        """Build an engine from a :class:`clawrl.models.Policy` (tokenizer gives EOS ids)."""
        tok = policy.tokenizer
        eos = inputs.policy_eos_ids(policy)
        kwargs.setdefault("max_context", policy.max_context)
        kwargs.setdefault("decode_text", lambda ids: tok.decode(ids, skip_special_tokens=False))
        if "tokenizer_id" not in kwargs:
            from clawrl.models import tokenizer_fingerprint

            kwargs["tokenizer_id"] = tokenizer_fingerprint(tok)
        return cls(policy.model, eos_token_ids=sorted(eos), **kwargs)

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        """Sample a completion; see :meth:`clawrl.engine.Engine.generate`.

        Raises:
            ContextLengthError: the prompt leaves no room for a completion.
            EngineClosedError: the engine was closed.
            EngineError: the model failed.
        """
        start = time.perf_counter()
        ids: list[int] = []
        lps: list[float] = []
        tops: list[list[tuple[int, float]]] = []
        ttft = 0.0
        finish = FinishReason.LENGTH
        version = self.policy_version
        adapter_version: int | None = None
        async for ev in self.generate_stream(prompt_ids, params):
            if not ids:
                ttft = time.perf_counter() - start
            ids.append(ev.token_id)
            lps.append(ev.logprob)
            tops.append(ev.top_logprobs)
            version = ev.policy_version
            adapter_version = ev.adapter_version
            if ev.finish_reason is not None:
                finish = ev.finish_reason
        return Completion(
            token_ids=ids,
            logprobs=lps,
            finish_reason=finish,
            policy_version=version,
            prompt_tokens=len(prompt_ids),
            top_logprobs=tops if params.logprobs_top_k else [],
            stop_string=self._matched_stop(ids, params) if finish == FinishReason.STOP else None,
            time_to_first_token=ttft,
            latency=time.perf_counter() - start,
            adapter_version=adapter_version,
        )

    async def generate_stream(
        self, prompt_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[TokenEvent]:
        """Yield each sampled token as soon as it exists; the last event has a finish reason.

        Closing the iterator early (e.g. the HTTP client went away) cancels the request: its
        row leaves the batch at the next step.
        """
        req = self._submit_gen(prompt_ids, params, asyncio.get_running_loop())
        q = req.emit.queue
        try:
            while True:
                item = await q.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            req.cancelled.set()

    def _submit_gen(
        self, prompt_ids: Sequence[int], params: SamplingParams, loop: asyncio.AbstractEventLoop
    ) -> _GenRequest:
        prompt = inputs.prompt_ids(prompt_ids, self.max_context)
        if self._closed:
            raise EngineClosedError("engine is closed")
        q: asyncio.Queue[TokenEvent | BaseException] = asyncio.Queue()
        emit = _LoopEmitter(q, loop)
        max_new = max(1, min(int(params.max_tokens), self.max_context - len(prompt)))
        req = _GenRequest(prompt, params, emit, max_new)
        self._inbox.put(req)
        return req

    async def score(
        self,
        prompt_ids: Sequence[int],
        target_ids: Sequence[int],
        *,
        temperature: float = 1.0,
        base: bool = False,
    ) -> list[float]:
        """Teacher-forced log-probs of ``target_ids`` (``[t]``) given ``prompt_ids``.

        Uses the same processing as sampling at ``temperature`` (no top-k / top-p), so for a
        completion sampled at temperature T with top_p = 1 and top_k = 0, ``score`` at T
        reproduces its sampling log-probs up to float error. Returns ``[t]`` floats (nats).
        """
        out = await self.score_batch([(prompt_ids, target_ids)], temperature=temperature, base=base)
        return out[0]

    async def score_batch(
        self,
        items: Sequence[tuple[Sequence[int], Sequence[int]]],
        *,
        temperature: float = 1.0,
        base: bool = False,
    ) -> list[list[float]]:
        """Score several ``(prompt_ids, target_ids)`` pairs in one padded forward pass.

        With ``base=True`` a LoRA adapter, if one is loaded, is disabled for this pass: the
        frozen base weights score (the OPD ``--teacher base`` option).

        Raises:
            ContextLengthError: a pair is longer than the context window.
        """
        norm = inputs.score_items(items, self.max_context)
        if self._closed:
            raise EngineClosedError("engine is closed")
        fut: concurrent.futures.Future[list[list[float]]] = concurrent.futures.Future()
        self._inbox.put(_ScoreRequest(norm, float(temperature), fut, base))
        return await asyncio.wrap_future(fut)

    async def score_next_batch(
        self,
        prompts: Sequence[Sequence[int]],
        candidates: Sequence[int],
        *,
        temperature: float = 1.0,
    ) -> list[list[float]]:
        """Next-token log-probs of ``candidates`` after each prompt: one forward per prompt.

        Returns ``[len(prompts)][len(candidates)]``: row i holds log p(c | prompts[i]) for each
        candidate id c, under the full-vocabulary distribution at ``temperature`` (the same as
        :meth:`score` with a one-token target, at a third of the cost for three candidates).
        Choice-scoring judges rank single-token verdicts with it.

        Raises:
            ContextLengthError: a prompt does not fit the context window.
        """
        first = [int(candidates[0])] if candidates else []
        norm = [(ids, first) for ids in inputs.next_token_prompts(prompts, self.max_context)]
        if self._closed:
            raise EngineClosedError("engine is closed")
        fut: concurrent.futures.Future[list[list[float]]] = concurrent.futures.Future()
        self._inbox.put(
            _ScoreRequest(norm, float(temperature), fut, candidates=[int(c) for c in candidates])
        )
        return await asyncio.wrap_future(fut)

    def load_policy(self, version: int, weights: Any) -> concurrent.futures.Future[int]:
        """Queue new weights as ``version``; returns a future resolved once they serve.

        Args:
            version: must be greater than the current version (versions only increase).
            weights: a full ``state_dict`` (``dict[str, Tensor]``) or the path of a PEFT LoRA
                adapter directory saved with ``save_pretrained``.

        Raises:
            ValueError: ``version`` does not increase.
        """
        if version <= self.policy_version:
            raise ValueError(f"policy versions only increase: {version} <= {self.policy_version}")
        fut: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._inbox.put(_SwapRequest(int(version), weights, fut))
        return fut

    def load_adapter(
        self, name: str, version: int, adapter_dir: str | Path
    ) -> concurrent.futures.Future[int]:
        """Serve requests naming ``name`` (``SamplingParams.adapter``) with the plain LoRA
        adapter at ``adapter_dir``, as ``version`` of it; see :meth:`clawrl.engine.Engine.load_adapter`.

        The future fails with ``ValueError`` (a version that does not increase, a module that is
        not a linear layer of the adapter's shape), :class:`~clawrl.engine.lora.UnsupportedAdapter`
        (DoRA, bias, ... : only plain LoRA is served per request) or ``FileNotFoundError``.
        """
        fut: concurrent.futures.Future[int] = concurrent.futures.Future()
        if self._closed:
            fut.set_exception(EngineClosedError("engine is closed"))
            return fut
        self._inbox.put(_AdapterRequest(str(name), int(version), Path(adapter_dir), fut))
        return fut

    def unload_adapter(self, name: str) -> concurrent.futures.Future[None]:
        """Stop serving adapter ``name`` (rows on it finish); see
        :meth:`clawrl.engine.Engine.unload_adapter`."""
        fut: concurrent.futures.Future[None] = concurrent.futures.Future()
        if self._closed:
            fut.set_exception(EngineClosedError("engine is closed"))
            return fut
        self._inbox.put(_AdapterRequest(str(name), None, None, fut))
        return fut

    def close(self) -> None:
        """Stop the engine thread; pending and running requests get :class:`EngineClosedError`."""
        if self._closed:
            return
        self._closed = True
        self._inbox.put(None)
        self._thread.join(timeout=30)

    # ------------------------------------------------------------------ engine thread

    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        while True:
            idle = not (
                self._rows or self._waiting or self._scores or self._swaps or self._adapter_ops
            )
            item: _Item | EllipsisType | None
            try:
                item = self._inbox.get(timeout=0.5) if idle else self._inbox.get_nowait()
            except queue.Empty:
                item = ...  # nothing new: step the running batch
            while not isinstance(item, EllipsisType):
                if item is None:
                    self._shutdown()
                    return
                self._accept(item)
                try:
                    item = self._inbox.get_nowait()
                except queue.Empty:
                    item = ...
            try:
                self._step()
            except Exception as e:  # the model failed: fail the rows, keep serving
                log.exception("engine step failed")
                self._fail_all(EngineError(f"engine step failed: {e}"))

    def _accept(self, item: _Item) -> None:
        if isinstance(item, _GenRequest):
            self._waiting.append(item)
        elif isinstance(item, _ScoreRequest):
            self._scores.append(item)
        elif isinstance(item, _AdapterRequest):
            self._adapter_ops.append(item)
        else:
            self._swaps.append(item)

    def _step(self) -> None:
        self._drop_cancelled()
        if self._adapter_ops:  # at once: rows keep the adapter version they started with
            self._apply_adapter_ops()
        if self._swaps and not self._rows:
            self._apply_swaps()
        if self._scores:
            reqs, self._scores = self._scores, []
            for r in reqs:
                self._run_score(r)
        if not self._swaps:
            self._admit()
        self.stats.queue_depth = len(self._waiting)
        self.stats.batch_size = len(self._rows)
        if self._rows:
            self._decode()

    def _drop_cancelled(self) -> None:
        self._waiting = [r for r in self._waiting if not r.cancelled.is_set()]
        keep = [i for i, row in enumerate(self._rows) if not row.req.cancelled.is_set()]
        if len(keep) != len(self._rows):
            self._select(keep)

    def _go_serial(self, why: str) -> None:
        """Stop batching requests together (once; the reason is logged as a warning)."""
        if self.batching == SERIAL:
            return
        self.batching = SERIAL
        model_type = getattr(getattr(self.model, "config", None), "model_type", None)
        log.warning(
            "continuous batching is off for model type %s: %s; requests are decoded one at a "
            "time (effective max_batch 1)",
            model_type or type(self.model).__name__,
            why,
        )

    def _batch_limit(self) -> int:
        return 1 if self.batching == SERIAL else self.max_batch

    def _admit(self) -> None:
        while self._waiting and len(self._rows) < self._batch_limit():
            req = self._waiting.pop(0)
            try:
                self._prefill(req)
            except EngineError as e:  # refused (an adapter that is not loaded): no traceback
                req.emit(e)
            except Exception as e:
                log.exception("prefill failed")
                req.emit(EngineError(f"prefill failed: {e}"))

    def _prefill(self, req: _GenRequest) -> None:
        ids = torch.tensor([req.prompt_ids], dtype=torch.long, device=self._device)
        # serial: the model builds its own cache
        given = {self._cache_kw: _batch_cache()} if self.batching == CONTINUOUS else {}
        adapter = self._acquire_adapter(req)
        try:
            self._prefill_with(req, ids, given, adapter)
        finally:
            if adapter is not None and not req.joined:  # its row never joined the batch
                self.adapters.release(adapter)

    def _prefill_with(
        self, req: _GenRequest, ids: torch.Tensor, given: dict[str, Any], adapter: AdapterKey | None
    ) -> None:
        """Prefill ``req`` (with ``adapter`` held) and add its row to the batch
        (``req.joined``), or re-queue it for the serial path."""
        # logits of the last position only: a 10k-token prompt would otherwise materialise
        # a [10k, vocab] float tensor (~2 GB for SmolLM2's 49k vocabulary)
        with self.adapters.rows([adapter]):
            out = self.model(input_ids=ids, use_cache=True, logits_to_keep=1, **given)
        cache = _output_cache(out, given.get(self._cache_kw))
        if self.batching == CONTINUOUS:
            why = cache_blocker(cache, len(req.prompt_ids))
            if why is not None:
                self._go_serial(why)
                # prefilled again on the serial path (after the rows running, if any): the
                # cache given here may not hold the model's state (RWKV returns its own)
                self._waiting.insert(0, req)
                return
        self.stats.prompt_tokens += len(req.prompt_ids)
        self.stats.requests += 1
        gen = None
        if req.params.seed is not None:
            # any int seeds (a request's seed + choice index may pass 2**63): reduce it mod 2**64
            gen = torch.Generator().manual_seed(int(req.params.seed) % 2**64)
        stop_ids = frozenset(req.params.stop_token_ids) | (
            frozenset() if req.params.ignore_eos else self.eos_token_ids
        )
        row = _Row(
            req, self.policy_version, adapter=adapter, real_len=len(req.prompt_ids),
            generator=gen, stop_ids=stop_ids,
        )  # fmt: skip
        token = self._sample([row], out.logits[:, -1, :])[0]
        self._merge(row, cache, token)
        req.joined = True  # from now on the batch releases its adapter when the row leaves
        self._after_sample([row], [token])

    def _acquire_adapter(self, req: _GenRequest) -> AdapterKey | None:
        """The adapter version a new row is served with (held until the row leaves).

        Raises:
            EngineError: the request names an adapter that is not loaded.
        """
        if req.params.adapter is None:
            return None
        try:
            return self.adapters.acquire(req.params.adapter)
        except LookupError as e:
            raise EngineError(str(e)) from None

    def _apply_adapter_ops(self) -> None:
        ops, self._adapter_ops = self._adapter_ops, []
        for op in ops:
            try:
                if op.version is None:
                    self.adapters.unload(op.name)
                    _settle(op.future, result=None)
                    continue
                from peft import PeftModel

                if isinstance(self.model, PeftModel):
                    raise EngineError(
                        "per-request adapters need a plain model; this engine serves its policy "
                        "through PEFT (an adapter merging cannot serve)"
                    )
                assert op.path is not None
                self.adapters.load(op.name, op.version, op.path)
                _settle(op.future, result=op.version)
            except Exception as e:
                log.warning("adapter %r version %s not loaded: %s", op.name, op.version, e)
                _settle(op.future, error=e)

    def _merge(self, row: _Row, cache: Any, token: int) -> None:
        """Add a prefilled row (batch 1 cache of length P) to the running batch.

        The first row takes ``cache`` as it is (whatever its kind: the only row of a serial
        engine); later rows need plain layers (:func:`cache_blocker`): ``layer.keys`` and
        ``layer.values`` ``[B, H, L, D]`` are left-padded to a common L and stacked along B.
        """
        p = row.real_len
        mask_new = torch.ones(1, p, dtype=torch.long, device=self._device)
        tok = torch.tensor([token], dtype=torch.long, device=self._device)
        if self._cache is None or not self._rows:
            self._cache, self._mask, self._last = cache, mask_new, tok
            self._rows = [row]
            return
        assert self._mask is not None and self._last is not None
        new_layers = [(layer.keys, layer.values) for layer in cache.layers]
        length = self._mask.shape[1]
        pad_new, pad_old = max(0, length - p), max(0, p - length)
        for layer, (k, v) in zip(self._cache.layers, new_layers, strict=True):
            ok, ov = _left_pad(layer.keys, pad_old), _left_pad(layer.values, pad_old)
            layer.keys = torch.cat([ok, _left_pad(k, pad_new)], dim=0)
            layer.values = torch.cat([ov, _left_pad(v, pad_new)], dim=0)
        self._mask = torch.cat(
            [_left_pad_2d(self._mask, pad_old), _left_pad_2d(mask_new, pad_new)], dim=0
        )
        self._last = torch.cat([self._last, tok])
        self._rows.append(row)

    def _select(self, keep: list[int]) -> None:
        """Keep only rows ``keep`` and trim columns that are padding in every remaining row."""
        kept = set(keep)
        for i, row in enumerate(self._rows):
            if i not in kept and row.adapter is not None:
                self.adapters.release(row.adapter)
        self._rows = [self._rows[i] for i in keep]
        if not self._rows:
            self._cache = self._mask = self._last = None
            return
        assert self._mask is not None and self._last is not None
        idx = torch.tensor(keep, dtype=torch.long, device=self._device)
        mask = self._mask.index_select(0, idx)
        first_real = int((mask.cumsum(dim=1) == 0).sum(dim=1).min())
        for layer in self._cache.layers:
            layer.keys = layer.keys.index_select(0, idx)[:, :, first_real:, :]
            layer.values = layer.values.index_select(0, idx)[:, :, first_real:, :]
        self._mask = mask[:, first_real:]
        self._last = self._last.index_select(0, idx)

    def _decode(self) -> None:
        assert self._mask is not None and self._last is not None
        if self._cache is None:  # serial, and the model returned no cache this engine can pass
            self._decode_without_cache()
            return
        rows = self._rows
        positions = torch.tensor(
            [[r.real_len] for r in rows], dtype=torch.long, device=self._device
        )
        ones = torch.ones(len(rows), 1, dtype=torch.long, device=self._device)
        mask = torch.cat([self._mask, ones], dim=1)
        with self.adapters.rows([r.adapter for r in rows]):
            out = self.model(
                input_ids=self._last[:, None],
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **{self._cache_kw: self._cache},
            )
        self._mask = mask
        for r in rows:
            r.real_len += 1
        self.stats.decode_steps += 1
        tokens = self._sample(rows, out.logits[:, -1, :])
        self._last = torch.tensor(tokens, dtype=torch.long, device=self._device)
        self._after_sample(rows, tokens)

    def _decode_without_cache(self) -> None:
        """One step of the single serial row by a forward pass over its whole sequence (prompt
        and tokens so far): exact for a model whose state this engine cannot hand back (e.g.
        RWKV returns ``state``, not a cache), at O(length) per token."""
        (row,) = self._rows
        seq = torch.tensor([row.req.prompt_ids + row.generated], device=self._device)
        with self.adapters.rows([row.adapter]):
            out = self.model(input_ids=seq, use_cache=False, logits_to_keep=1)
        row.real_len += 1
        self.stats.decode_steps += 1
        tokens = self._sample([row], out.logits[:, -1, :])
        self._last = torch.tensor(tokens, dtype=torch.long, device=self._device)
        self._after_sample([row], tokens)

    def _sample(self, rows: list[_Row], logits: torch.Tensor) -> list[int]:
        params = [r.req.params for r in rows]
        temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32)
        top_k = torch.tensor([p.top_k for p in params], dtype=torch.long)
        top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32)
        logprobs = processed_logprobs(logits.cpu(), temperature, top_k, top_p)
        greedy = [is_greedy(p.temperature) for p in params]
        tokens = sample_rows(logprobs, greedy, [r.generator for r in rows]).tolist()
        for i, row in enumerate(rows):
            tok = tokens[i]
            k = row.req.params.logprobs_top_k
            tops: list[tuple[int, float]] = []
            if k > 0:
                vals, idx = torch.topk(logprobs[i], min(k, logprobs.shape[-1]))
                tops = [(int(a), float(b)) for a, b in zip(idx, vals, strict=True)]
            row.generated.append(tok)
            row.pending = TokenEvent(
                tok, float(logprobs[i, tok]), tops, None, row.version,
                None if row.adapter is None else row.adapter[1],
            )  # fmt: skip
        self.stats.generated_tokens += len(rows)
        return tokens

    def _after_sample(self, rows: list[_Row], tokens: list[int]) -> None:
        done: list[int] = []
        for i, (row, tok) in enumerate(zip(rows, tokens, strict=True)):
            ev = row.pending
            assert ev is not None
            finish = None
            if tok in row.stop_ids or self._matched_stop(row.generated, row.req.params):
                finish = FinishReason.STOP
            elif len(row.generated) >= row.req.max_new:
                finish = FinishReason.LENGTH
            ev.finish_reason = finish
            row.req.emit(ev)
            if finish is not None:
                done.append(i)
        if done:
            rows_now = self._rows
            drop = {id(rows[i]) for i in done}
            self._select([j for j, r in enumerate(rows_now) if id(r) not in drop])

    def _matched_stop(self, ids: list[int], params: SamplingParams) -> str | None:
        if not params.stop or self.decode_text is None or not ids:
            return None
        text = self.decode_text(ids)
        for s in params.stop:
            if s and s in text:
                return s
        return None

    def _run_score(self, req: _ScoreRequest) -> None:
        try:
            if req.base and self._lora.active:  # the base weights, substituted for one pass
                base = self._lora.base_parameters()
                result = self._score_items(req.items, req.temperature, req.candidates, base)
            elif req.base and hasattr(self.model, "disable_adapter"):
                with self.model.disable_adapter():
                    result = self._score_items(req.items, req.temperature, req.candidates)
            else:
                result = self._score_items(req.items, req.temperature, req.candidates)
            _settle(req.future, result=result)
        except Exception as e:
            _settle(req.future, error=EngineError(f"scoring failed: {e}"))

    def _score_items(
        self,
        items: list[tuple[list[int], list[int]]],
        temperature: float,
        candidates: list[int] | None = None,
        parameters: dict[str, torch.Tensor] | None = None,
    ) -> list[list[float]]:
        seqs = [p + t for p, t in items]
        length = max(len(s) for s in seqs)
        pad = 0
        ids = torch.full((len(seqs), length), pad, dtype=torch.long)
        mask = torch.zeros((len(seqs), length), dtype=torch.long)
        for i, s in enumerate(seqs):  # left padding, like the running batch
            ids[i, length - len(s) :] = torch.tensor(s)
            mask[i, length - len(s) :] = 1
        positions = (mask.cumsum(dim=1) - 1).clamp(min=0)
        # Left padding puts every target at the end of its row: only the last ``keep``
        # positions' logits are computed (the prompt's would cost [B, L, vocab] floats).
        keep = max(len(t) for _, t in items) + 1
        inputs = {
            "input_ids": ids.to(self._device),
            "attention_mask": mask.to(self._device),
            "position_ids": positions.to(self._device),
            "logits_to_keep": keep,
            "use_cache": False,  # one pass: a KV cache would only cost memory
        }
        if parameters:  # e.g. the base weights in place of a merged LoRA version's
            logits = torch.func.functional_call(self.model, parameters, (), inputs).logits
        else:
            logits = self.model(**inputs).logits
        offset = length - logits.shape[1]  # position of logits[:, 0] in the full sequence
        out: list[list[float]] = []
        for i, (p, t) in enumerate(items):
            if not t:
                out.append([])
                continue
            start = length - len(seqs[i]) + len(p) - 1 - offset
            rows = logits[i, start : start + len(t)]
            temp = torch.full((len(t),), float(temperature))
            lp = processed_logprobs(
                rows.cpu(), temp, torch.zeros(len(t), dtype=torch.long), torch.ones(len(t))
            )
            if candidates is not None:  # next-token mode: the first row, at the candidates
                out.append(lp[0, torch.tensor(candidates, dtype=torch.long)].tolist())
                continue
            target = torch.tensor(t, dtype=torch.long)
            out.append(lp.gather(-1, target[:, None]).squeeze(-1).tolist())
        return out

    def _apply_swaps(self) -> None:
        swaps, self._swaps = self._swaps, []
        for s in swaps:
            try:
                if s.version <= self.policy_version:
                    raise ValueError(f"stale policy version {s.version} <= {self.policy_version}")
                self._load_weights(s.weights)
                self.policy_version = s.version
                _settle(s.future, result=s.version)
            except Exception as e:
                log.exception("policy swap to version %s failed", s.version)
                _settle(s.future, error=e)

    def _load_weights(self, weights: Any) -> None:
        if isinstance(weights, dict):
            result = self.model.load_state_dict(weights, strict=False)
            if result.missing_keys or result.unexpected_keys:
                raise ValueError(
                    f"weights do not match the model: missing {result.missing_keys[:10]}, "
                    f"unexpected {result.unexpected_keys[:10]}"
                )
            self._lora.forget()  # these weights are whole: no LoRA base under them any more
            return
        path = Path(weights)
        if not (path / "adapter_config.json").is_file():
            raise ValueError(f"{path} is neither a state dict nor a PEFT adapter directory")
        from peft import PeftModel

        if not isinstance(self.model, PeftModel):
            try:  # plain LoRA: merged into the model's own weights (clawrl.engine.lora)
                self._lora.apply(lora_deltas(path))
                return
            except UnsupportedAdapter as e:
                log.info("serving %s through PEFT: %s", path, e)
                if self._lora.active:  # back to the base weights under the PEFT wrapper
                    self._lora.apply({})
                    self._lora.forget()

        name = f"v{self.policy_version + 1}_{time.monotonic_ns()}"
        if isinstance(self.model, PeftModel):
            old = self.model.active_adapter
            self.model.load_adapter(str(path), adapter_name=name)
            self.model.set_adapter(name)
            if isinstance(old, str) and old != name:
                self.model.delete_adapter(old)
        else:
            self.model = PeftModel.from_pretrained(self.model, str(path), adapter_name=name)
        self.model.eval()

    def _fail_all(self, err: BaseException) -> None:
        for row in self._rows:
            if row.adapter is not None:
                self.adapters.release(row.adapter)
            row.req.emit(err)
        for req in self._waiting:
            req.emit(err)
        self._rows, self._waiting = [], []
        self._cache = self._mask = self._last = None

    def _shutdown(self) -> None:
        err = EngineClosedError("engine closed")
        self._fail_all(err)
        for s in self._scores:
            _settle(s.future, error=err)
        for w in self._swaps:
            _settle(w.future, error=err)
        for a in self._adapter_ops:
            _settle(a.future, error=err)
        self.adapters.close()


def config_blocker(config: Any) -> str | None:
    """Why requests of a model with this ``config`` cannot share one padded KV cache, or None.

    They can when every decoder layer is a full or sliding-window attention layer whose cache
    ``transformers`` builds as a plain ``DynamicLayer`` / ``DynamicSlidingWindowLayer`` (the
    engine then keeps all of them as full ``DynamicLayer``: see the module doc). Anything else
    (linear attention, convolution or SSM states, KV sharing, chunked attention, a layer type
    this check does not know) blocks.
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    if config is None:
        return "the model has no config"
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    odd_types = sorted(set(getattr(text, "layer_types", None) or ()) - _PLAIN_LAYER_TYPES)
    if odd_types:
        return f"its layer types include {odd_types}"
    if getattr(text, "attention_chunk_size", None):
        return "it uses chunked attention"
    try:
        probe = DynamicCache(config=config)  # the layers transformers would give it; no tensors
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        return f"transformers cannot build a DynamicCache for it ({type(e).__name__}: {e})"
    plain = (DynamicLayer, DynamicSlidingWindowLayer)
    odd_layers = sorted({type(x).__name__ for x in probe.layers if type(x) not in plain})
    if odd_layers:
        return f"its cache has {odd_layers} layers"
    return None


def _batch_cache() -> Any:
    """An empty cache for a prefill that will join the batch: every layer a plain, never-evicting
    ``DynamicLayer`` (created as the model reaches it), sliding-window layers included, so that
    :meth:`TransformersEngine._merge` can pad and stack it (see the module doc)."""
    from transformers import DynamicCache

    return DynamicCache()  # no config: no DynamicSlidingWindowLayer


def cache_blocker(cache: Any, length: int) -> str | None:
    """Why a prefilled batch-1 ``cache`` of ``length`` tokens cannot join a running batch, or
    None if it can: a ``DynamicCache`` whose every layer is a plain ``DynamicLayer`` holding
    ``keys`` and ``values`` of shape ``[1, heads, length, head_dim]``."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    if type(cache) is not DynamicCache:
        return f"its cache is a {type(cache).__name__}, not a DynamicCache"
    if not cache.layers:
        return "its cache holds no layers"
    for i, layer in enumerate(cache.layers):
        if type(layer) is not DynamicLayer:
            return f"cache layer {i} is a {type(layer).__name__}"
        for name in ("keys", "values"):
            t = getattr(layer, name, None)
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else None
            if shape is None or len(shape) != 4 or shape[0] != 1 or shape[2] != length:
                return f"cache layer {i} holds {name} of shape {shape}, not [1, H, {length}, D]"
    return None


def _output_cache(out: Any, given: Any) -> Any:
    """The cache a forward pass returned (``cache`` in transformers >= 5.2x, else
    ``past_key_values``), or ``given`` if it returned none."""
    for name in ("cache", "past_key_values"):
        found = getattr(out, name, None)
        if found is not None:
            return found
    return given


def _settle(
    future: concurrent.futures.Future[Any],
    *,
    result: Any = None,
    error: BaseException | None = None,
) -> None:
    """Resolve ``future`` unless its waiter already gave up on it (a judge timeout cancels the
    scoring future it waited on; setting a cancelled future raises ``InvalidStateError``, which
    would kill the engine thread)."""
    if future.done():
        return
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except concurrent.futures.InvalidStateError:  # cancelled between the check and the set
        pass


class _LoopEmitter:
    """Delivers engine events to an asyncio queue from the engine thread."""

    def __init__(
        self, q: asyncio.Queue[TokenEvent | BaseException], loop: asyncio.AbstractEventLoop
    ) -> None:
        self.queue = q
        self._loop = loop

    def __call__(self, item: TokenEvent | BaseException) -> None:
        if not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.queue.put_nowait, item)


def _left_pad(x: torch.Tensor, n: int) -> torch.Tensor:
    """Left-pad a ``[B, H, L, D]`` cache tensor with ``n`` zero columns along L."""
    if n <= 0:
        return x
    pad = torch.zeros(x.shape[0], x.shape[1], n, x.shape[3], dtype=x.dtype, device=x.device)
    return torch.cat([pad, x], dim=2)


def _left_pad_2d(x: torch.Tensor, n: int) -> torch.Tensor:
    if n <= 0:
        return x
    return torch.cat([torch.zeros(x.shape[0], n, dtype=x.dtype, device=x.device), x], dim=1)
