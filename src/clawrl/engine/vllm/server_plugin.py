"""A vLLM general plugin: prompt log-probs at a request's own temperature.

This file runs **inside the vLLM server's processes**, not in clawrl's: it imports nothing from
clawrl (the server's Python usually has no clawrl) and is loaded by vLLM's plugin mechanism
(entry point group ``vllm.general_plugins``, loaded in the API server, the engine core and every
worker). :func:`plugin_dir` writes this file and a distribution record naming its entry point
into a folder; a server whose ``PYTHONPATH`` holds that folder loads it. clawrl does this for the
servers it launches (:class:`clawrl.engine.vllm.VLLMServer`); for a server of your own::

    python -m clawrl.engine.vllm.server_plugin /opt/clawrl-plugin   # prints the PYTHONPATH line
    PYTHONPATH=/opt/clawrl-plugin vllm serve ...

Why: vLLM computes ``prompt_logprobs`` from the raw logits (prompt tokens skip the sampling
processors, ``vllm/v1/worker/gpu_model_runner.py`` ``_get_prompt_logprobs_dict``), so the
teacher log-probs of an OPD target at a sampling temperature T != 1 would need one request per
target token. With this plugin a request whose body carries
``"vllm_xargs": {"clawrl_prompt_temperature": T}`` gets ``log_softmax(logits / T)`` for its
prompt log-probs in one request: the same formula as vLLM's sampler (``Sampler.apply_temperature``
divides float32 logits by T before ``compute_logprobs``) and clawrl's transformers engine.
Requests without the key keep vLLM's values.

It also fixes two crashes of vLLM 0.32's CPU build. With LoRA enabled, a step holding a request
with prompt log-probs and any other request killed the engine core (:func:`_one_sampler_index`);
the plugin runs each prompt slice's logits with its own request's adapter index. And a request
with a ``seed`` whose prompt is prefilled over several engine steps (chunked prefill: a prompt
longer than ``--max-num-batched-tokens``, or several prompts that together are) killed it too:
vLLM rewinds the seeded generator of a request whose sampled token it discards with
``Generator.set_offset``, which only CUDA generators have ("CPU Generator does not use
offset"); the plugin saves those CPU generators' states before sampling and puts them back
instead (:func:`_keep_seeded_states`), so a seeded request samples the same tokens however its
prompt was cut.

How: the model runner's method is wrapped; while it runs, ``model.compute_logits`` is wrapped
too, and divides the logits of a request's prompt slice by its T. The slice is recognised by
where it starts in the step's hidden states (the method slices ``hidden_states[offset:...]``
with ``offset = query_start_loc[request index]``). On a vLLM whose method does not contain the
lines this relies on (:data:`MARKERS`), nothing is patched and the server logs why; clawrl then
finds the plugin inactive at start (:func:`clawrl.engine.vllm.checks.check_prompt_temperature`)
and scores per position instead. A value of the key that is not a finite number > 0 is refused
where vLLM builds the request (a 400). Should a request's slice not be found at all (not seen on
the vLLM this was written for), the step raises rather than return temperature-1 values; vLLM
then stops its engine core, which fails every request in flight and takes the server down (a
server clawrl launched is restarted).
"""

from __future__ import annotations

import inspect
import logging
import math
import sys
from pathlib import Path
from typing import Any

NAME = "clawrl_prompt_temperature"
"""The plugin's entry point name, and the ``vllm_xargs`` key a request sets to T."""

MODULE = "clawrl_vllm_plugin"
"""The module name this file is written under in :func:`plugin_dir`."""

VERSION = "2"
"""Bumped when the plugin's behaviour changes."""

MARKERS = (
    "prompt_hidden_states = hidden_states[offset : offset + num_logits]",
    "logits = self.model.compute_logits(prompt_hidden_states)",
    "offset = self.query_start_loc.np[req_idx].item()",
)
"""Lines of vLLM's ``_get_prompt_logprobs_dict`` the patch relies on (vLLM 0.32)."""

SEEDED_MARKER = "gen.set_offset(gen.get_offset() - 4)"
"""The line of vLLM's ``_bookkeeping_sync`` that rewinds a discarded request's generator
(vLLM 0.32); :func:`_keep_seeded_states` is applied only where it is found."""

log = logging.getLogger("clawrl.vllm_plugin")


def _valid(value: Any) -> float:
    """``value`` as a temperature: a finite number > 0.

    Raises:
        ValueError: anything else.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{NAME} must be a number, got {value!r}")
    t = float(value)
    if not (t > 0.0 and math.isfinite(t)):
        raise ValueError(f"{NAME} must be a finite number > 0, got {value!r}")
    return t


def _temperature(request: Any) -> float | None:
    params = getattr(request, "sampling_params", None)
    extra = getattr(params, "extra_args", None) or {}
    value = extra.get(NAME)
    return None if value is None else _valid(value)


def _logits_punica(runner: Any) -> Any:
    """The CPU LoRA wrapper of the model's logits processor, or ``None`` (no LoRA, or another
    platform's kernels: left alone). Cached on the runner."""
    cached = runner.__dict__.get("_clawrl_logits_punica", False)
    if cached is not False:
        return cached
    found = None
    modules = getattr(runner.model, "modules", None)
    for m in modules() if callable(modules) else ():
        if type(m).__name__ == "LogitsProcessorWithLoRA":
            punica = getattr(m, "punica_wrapper", None)
            if type(punica).__name__ == "PunicaWrapperCPU" and all(
                hasattr(punica, a) for a in ("_sampler_indices", "indices_len")
            ):
                found = punica
            break
    runner.__dict__["_clawrl_logits_punica"] = found
    return found


def _one_sampler_index(punica: Any, index: int, num_reqs: int, fn: Any) -> Any:
    """Run ``fn`` with the logits processor's LoRA indices reduced to request ``index``'s.

    vLLM 0.32's CPU kernels (``vllm/lora/ops/torch_ops`` ``bgmv_shrink``) pair the i-th row of
    the logits' input with the i-th sampler index, one per request in the batch; a prompt slice
    has one row per prompt position, so with two requests or more in the step the shapes clash
    and the engine core dies (seen: ``einsum(): subscript b has size 2 ... size 57``). One index
    broadcasts over the slice's rows: the request's own adapter for each of its positions. Only
    when there is one index per request (``num_reqs`` of them; speculative decoding repeats a
    request's index per sampled token, and then nothing is changed).
    """
    n = punica.indices_len[1]
    if n is None or n <= 1 or n != num_reqs:
        return fn()
    saved = punica._sampler_indices[:n].clone()
    punica._sampler_indices[0] = saved[index]
    punica.indices_len[1] = 1
    try:
        return fn()
    finally:
        punica._sampler_indices[:n] = saved
        punica.indices_len[1] = n


def _wrap(original: Any) -> Any:
    import torch

    def _get_prompt_logprobs_dict(self: Any, hidden_states: Any, num_scheduled_tokens: Any) -> Any:
        punica = _logits_punica(self)
        slices: dict[int, tuple[int, float | None]] = {}  # first row -> (request index, T)
        for req_id in self.num_prompt_logprobs or {}:
            request = self.requests.get(req_id)
            scheduled = num_scheduled_tokens.get(req_id)
            if request is None or scheduled is None or request.prompt_token_ids is None:
                continue
            t = _temperature(request)
            # as vLLM counts them: the prompt positions left that this step computes
            left = len(request.prompt_token_ids) - request.num_computed_tokens - 1
            if (t is None and punica is None) or min(int(scheduled), left) <= 0:
                continue
            index = self.input_batch.req_id_to_index[req_id]
            slices[int(self.query_start_loc.np[index].item())] = (index, t)
        if not slices:
            return original(self, hidden_states, num_scheduled_tokens)
        model = self.model
        inner = model.compute_logits
        base = hidden_states.data_ptr()
        row_bytes = hidden_states.stride(0) * hidden_states.element_size()
        seen: set[int] = set()

        def compute_logits(h: Any, *args: Any, **kwargs: Any) -> Any:
            row, rest = divmod(h.data_ptr() - base, row_bytes)
            hit = slices.get(row) if rest == 0 else None
            if hit is None:
                return inner(h, *args, **kwargs)
            seen.add(row)
            index, t = hit
            if punica is not None:
                logits = _one_sampler_index(punica, index, self.input_batch.num_reqs,
                                            lambda: inner(h, *args, **kwargs))  # fmt: skip
            else:
                logits = inner(h, *args, **kwargs)
            return logits if t is None else logits.to(torch.float32) / t

        model.__dict__["compute_logits"] = compute_logits  # shadows the method while we run
        try:
            out = original(self, hidden_states, num_scheduled_tokens)
        finally:
            model.__dict__.pop("compute_logits", None)
        missed = [r for r, (_i, t) in slices.items() if t is not None and r not in seen]
        if missed:  # it asked for T and vLLM computed its logits elsewhere than we know
            raise RuntimeError(f"{NAME}: a prompt slice starting at row {missed[0]} was not "
                               "recognised; refusing to return temperature-1 log-probs")  # fmt: skip
        return out

    _get_prompt_logprobs_dict.__wrapped__ = original  # type: ignore[attr-defined]
    _get_prompt_logprobs_dict.clawrl_plugin = VERSION  # type: ignore[attr-defined]
    return _get_prompt_logprobs_dict


def _keep_seeded_states(sample_tokens: Any, bookkeeping: Any) -> tuple[Any, Any]:
    """Wrappers of the model runner's ``sample_tokens`` and ``_bookkeeping_sync``: the first
    saves the state of every CPU generator of a request whose sampled token this step discards
    (a prompt not yet wholly prefilled: ``discard_request_mask``, set before sampling), the
    second hides those generators from vLLM's rewind (which would call ``set_offset``, CUDA
    only) and restores their saved states instead: the same effect, on a CPU. CUDA generators
    are left to vLLM. (vLLM's V2 CPU model runner, ``VLLM_USE_V2_MODEL_RUNNER``, seeds by
    hashing, without stateful generators, and is not patched.)"""
    import functools

    @functools.wraps(sample_tokens)
    def sample_tokens_(self: Any, grammar_output: Any) -> Any:
        saved: dict[int, Any] = {}
        if getattr(self, "execute_model_state", None) is not None:
            n = self.input_batch.num_reqs
            for i in self.discard_request_mask.np[:n].nonzero()[0]:
                gen = self.input_batch.generators.get(int(i))
                if gen is not None and gen.device.type == "cpu":
                    saved[int(i)] = gen.get_state()
        self._clawrl_seeded = saved
        try:
            return sample_tokens(self, grammar_output)
        finally:
            self._clawrl_seeded = {}

    @functools.wraps(bookkeeping)
    def bookkeeping_(self: Any, *args: Any, **kwargs: Any) -> Any:
        saved: dict[int, Any] = getattr(self, "_clawrl_seeded", None) or {}
        gens = self.input_batch.generators
        held = {i: gens.pop(i) for i in saved if i in gens}
        try:
            return bookkeeping(self, *args, **kwargs)
        finally:
            for i, gen in held.items():
                gen.set_state(saved[i])
                gens[i] = gen

    sample_tokens_.clawrl_plugin = True  # type: ignore[attr-defined]
    bookkeeping_.clawrl_plugin = True  # type: ignore[attr-defined]
    return sample_tokens_, bookkeeping_


def _patch_seeded(runner: Any) -> None:
    """Apply :func:`_keep_seeded_states` to ``runner`` (the model runner class) when its
    ``_bookkeeping_sync`` holds :data:`SEEDED_MARKER`; else log why not. Idempotent."""
    sample = runner.__dict__.get("sample_tokens")
    book = runner.__dict__.get("_bookkeeping_sync")
    if getattr(book, "clawrl_plugin", None):
        return
    if sample is None or book is None:
        log.warning("%s: vLLM's model runner has no sample_tokens / _bookkeeping_sync: seeded "
                    "requests keep vLLM's own generator rewind", NAME)  # fmt: skip
        return
    try:
        source = inspect.getsource(book)
    except (OSError, TypeError):
        source = ""
    if SEEDED_MARKER not in source:
        log.warning("%s: vLLM's _bookkeeping_sync differs from the one this plugin knows: "
                    "seeded requests keep vLLM's own generator rewind", NAME)  # fmt: skip
        return
    runner.sample_tokens, runner._bookkeeping_sync = _keep_seeded_states(sample, book)
    log.info("%s %s: active (seeded requests keep their CPU generators' states when a token "
             "is discarded)", NAME, VERSION)  # fmt: skip


def _validate_requests() -> None:
    """Check the key where vLLM builds a request's ``SamplingParams`` (the API server): a bad
    value is the client's 400 there, never an exception in the engine core (which would stop
    the whole server)."""
    try:
        from vllm.exceptions import VLLMValidationError
        from vllm.sampling_params import SamplingParams
    except Exception as e:
        log.warning("%s: cannot check requests (%s)", NAME, e)
        return
    verify = SamplingParams.__dict__.get("_verify_args")
    if verify is None or getattr(verify, "clawrl_plugin", None):
        return

    def _verify_args(self: Any) -> None:
        verify(self)
        value = (self.extra_args or {}).get(NAME)
        if value is not None:
            try:
                _valid(value)
            except ValueError as e:
                raise VLLMValidationError(str(e), parameter="vllm_xargs") from None

    _verify_args.clawrl_plugin = VERSION  # type: ignore[attr-defined]
    SamplingParams._verify_args = _verify_args  # type: ignore[method-assign]


def register() -> None:
    """vLLM's entry point: check requests' values, patch the model runner; once per process
    (idempotent)."""
    _validate_requests()
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except Exception as e:  # the API server process of a build without the V1 runner
        log.warning("%s: vLLM's V1 model runner is not importable (%s): not active", NAME, e)
        return
    _patch_seeded(GPUModelRunner)
    method = GPUModelRunner.__dict__.get("_get_prompt_logprobs_dict")
    if method is None:
        log.warning("%s: this vLLM has no _get_prompt_logprobs_dict: not active", NAME)
        return
    if getattr(method, "clawrl_plugin", None):
        return
    try:
        source = inspect.getsource(method)
    except (OSError, TypeError) as e:
        log.warning("%s: cannot read vLLM's _get_prompt_logprobs_dict (%s): not active", NAME, e)
        return
    missing = [m for m in MARKERS if m not in source]
    if missing:
        log.warning("%s: vLLM's _get_prompt_logprobs_dict differs from the one this plugin "
                    "knows (missing %r): not active", NAME, missing[0])  # fmt: skip
        return
    GPUModelRunner._get_prompt_logprobs_dict = _wrap(method)  # type: ignore[method-assign]
    log.info("%s %s: active (prompt log-probs at the request's %s)", NAME, VERSION, NAME)


def plugin_dir(folder: str | Path) -> Path:
    """Write the plugin into ``folder`` (this module as ``clawrl_vllm_plugin.py`` and a
    ``.dist-info`` whose ``entry_points.txt`` names :func:`register` in
    ``vllm.general_plugins``); returns the folder, which a vLLM server's ``PYTHONPATH`` must
    hold. Idempotent."""
    root = Path(folder)
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{MODULE}.py").write_text(Path(__file__).read_text())
    for old in root.glob(f"{MODULE}-*.dist-info"):  # another version's record: two entry points
        if old.name != f"{MODULE}-{VERSION}.dist-info":
            for f in old.iterdir():
                f.unlink()
            old.rmdir()
    info = root / f"{MODULE}-{VERSION}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {MODULE}\nVersion: {VERSION}\n"
        "Summary: clawrl's vLLM plugin: prompt log-probs at the request's temperature\n"
    )
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{NAME} = {MODULE}:register\n")
    return root


if __name__ == "__main__":  # python -m clawrl.engine.vllm.server_plugin FOLDER
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) == 2 else 2)
    where = plugin_dir(sys.argv[1]).resolve()
    print(f"wrote clawrl's vLLM plugin to {where}; start your server with\n"
          f"  PYTHONPATH={where}${{PYTHONPATH:+:$PYTHONPATH}} vllm serve ...")  # fmt: skip
