"""What clawrl checks before it serves through a vLLM server, and refuses otherwise.

A server that returns raw (temperature-1) log-probs, or whose tokenizer maps ids to other text
than the policy's, would make every recorded turn wrong without any error: so each replica is
checked once, at start, and refused with a message that says how to fix it.

* **Processed log-probs** (``--logprobs-mode processed_logprobs``): the log-prob vLLM returns
  for a sampled token must be that of the distribution it sampled from. vLLM does not report
  the mode over HTTP, so it is probed: the top token's log-prob after one prompt, at
  temperature 1 and at temperature 2, is equal in raw mode and differs in processed mode.
* **The same tokenizer** (vocabulary hash): when the server's model directory (``root`` in
  ``/v1/models``) is readable here, its tokenizer's :func:`clawrl.models.tokenizer_fingerprint`
  must equal the policy's. Otherwise a probe hash: the ids ``/tokenize`` gives for a fixed set
  of texts and the text ``/detokenize`` gives for a spread of ids across the vocabulary must
  equal the local tokenizer's.

Not refused, but probed and reported: whether the server runs clawrl's plugin, which gives prompt
log-probs at a request's temperature in one request (:func:`check_prompt_temperature`); without
it, teacher scoring at T != 1 takes one request per target token.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from clawrl.errors import EngineError

PROBE_TEXTS: tuple[str, ...] = (
    "Hello, world! 12345 + 678 = 7023.",
    "  leading spaces\tand\ttabs\nand newlines\n\n",
    "naïve café — “quotes” 東京 🙂 ﬁ",
    "def f(x):\n    return x ** 2  # code",
    "<|im_start|>user\nhi<|im_end|>",
    "ThE qUiCk BrOwN fOx JuMpS oVeR tHe LaZy DoG.",
)
"""Texts whose ids the server's tokenizer must reproduce (special tokens, unicode, code)."""

PROBE_IDS = 256
"""Ids spread over the vocabulary that ``/detokenize`` must turn into the local text."""


PROMPT_TEMPERATURE_PROBE = 0.5
"""The temperature :func:`check_prompt_temperature` probes at."""
PROBE_TOLERANCE = 1e-3
"""Nats per token within which the plugin's log-probs must equal vLLM's sampler's, or ..."""
PROBE_RELATIVE = 0.1
"""... within this share of how far the temperature-1 values are from them (kernels of a prompt
pass and a decode step differ by more than 1e-3 in bfloat16 on GPUs)."""
PROBE_MIN_GAP = 0.05
"""Nats: below this, the temperature-1 values are too close to the probe's answer to tell."""


@dataclass(frozen=True)
class ServerInfo:
    """What a checked replica serves.

    Attributes:
        url: its base URL.
        model: the served name of the base model.
        max_model_len: its context window in tokens.
        root: the model directory or hub id the server loaded.
        tokenizer_check: ``fingerprint`` (vocabulary hash compared) or ``probe``.
        prompt_temperature: whether it scores prompt log-probs at a request's temperature in
            one request (clawrl's plugin, :func:`check_prompt_temperature`).
    """

    url: str
    model: str
    max_model_len: int
    root: str
    tokenizer_check: str
    prompt_temperature: bool = False


def _base_model(models: dict[str, Any], url: str) -> tuple[str, int, str]:
    data = models.get("data") or []
    bases = [m for m in data if isinstance(m, dict) and not m.get("parent")]
    if not bases:
        raise EngineError(f"vLLM at {url} lists no base model in /v1/models")
    m = bases[0]
    return str(m["id"]), int(m.get("max_model_len") or 0), str(m.get("root") or m["id"])


async def _post(client: httpx.AsyncClient, url: str, path: str, body: dict[str, Any]) -> Any:
    r = await client.post(f"{url}{path}", json=body)
    if r.status_code != 200:
        raise EngineError(f"vLLM at {url}{path} answered HTTP {r.status_code}: {r.text[:300]}")
    return r.json()


async def check_logprobs_mode(client: httpx.AsyncClient, url: str, model: str, bos: int) -> None:
    """Refuse a server that returns raw log-probs (see the module docstring).

    Raises:
        EngineError: the server's log-probs do not depend on the temperature.
    """
    tops = []
    for temperature in (1.0, 2.0):
        body = {
            "model": model, "prompt": [bos], "max_tokens": 1, "temperature": temperature,
            "seed": 0, "logprobs": 1, "return_tokens_as_token_ids": True,
        }  # fmt: skip
        out = await _post(client, url, "/v1/completions", body)
        alternatives = out["choices"][0]["logprobs"]["top_logprobs"][0]
        tops.append(max(float(v) for v in alternatives.values()))
    if max(tops) > 0.0:
        raise EngineError(
            f"vLLM at {url} returns logits, not log-probs: start the server with "
            "--logprobs-mode processed_logprobs"
        )
    if abs(tops[0] - tops[1]) < 1e-4:
        raise EngineError(
            f"vLLM at {url} returns raw log-probs (the same at temperature 1 and 2): clawrl "
            "records the log-probs of the distribution it sampled from, so start the server "
            "with --logprobs-mode processed_logprobs"
        )


def temperature_probe_ids(tokenizer: Any) -> list[int]:
    """The ids :func:`check_prompt_temperature` scores: BOS (or id 0) and a few text ids."""
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else 0
    return [int(bos), *tokenizer.encode(PROBE_TEXTS[0], add_special_tokens=False)[:6]]


async def check_prompt_temperature(
    client: httpx.AsyncClient, url: str, model: str, probe_ids: list[int]
) -> bool:
    """Whether the server at ``url`` runs clawrl's plugin correctly: the prompt log-probs of
    ``probe_ids[1:]`` at :data:`PROMPT_TEMPERATURE_PROBE`, asked for in one request, must equal
    vLLM's own temperature-scaled next-token log-probs (one request per position, the sampler's
    path) within :data:`PROBE_TOLERANCE` or :data:`PROBE_RELATIVE` of the distance of the
    temperature-1 values from them. ``False`` when the plugin is absent (the answer is the
    temperature-1 one), gives other values, or the probe cannot tell (logged as a warning by
    the caller).

    Raises:
        EngineError: the server refuses the probe requests.
    """
    from clawrl.engine.vllm import protocol

    prompt, target = probe_ids[:1], probe_ids[1:]
    t = PROMPT_TEMPERATURE_PROBE

    async def prompt_logprobs(temperature: float) -> list[float]:
        body = protocol.prompt_logprobs_body(model, prompt, target, temperature)
        out = await _post(client, url, "/v1/completions", body)
        return protocol.parse_prompt_logprobs(out, len(prompt), target)

    got, at_one = await prompt_logprobs(t), await prompt_logprobs(1.0)
    want = []
    for i, tok in enumerate(target):
        body = protocol.next_token_body(model, prompt + target[:i], [tok], t)
        want.append(protocol.parse_next_token(await _post(client, url, "/v1/completions", body),
                                              [tok])[0])  # fmt: skip
    gap = max(abs(a - b) for a, b in zip(at_one, want, strict=True))
    if gap <= PROBE_MIN_GAP:  # temperature barely matters for these ids: the probe cannot tell
        return False
    err = max(abs(a - b) for a, b in zip(got, want, strict=True))
    return err <= max(PROBE_TOLERANCE, PROBE_RELATIVE * gap)


def _local_fingerprint(root: str) -> str | None:
    path = Path(root)
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        return None
    from transformers import AutoTokenizer

    from clawrl.models import tokenizer_fingerprint

    return tokenizer_fingerprint(AutoTokenizer.from_pretrained(str(path)))


def probe_ids(vocab_size: int) -> list[int]:
    """:data:`PROBE_IDS` ids spread evenly over ``[0, vocab_size)``, the last id included."""
    n = min(PROBE_IDS, vocab_size)
    return sorted({round(i * (vocab_size - 1) / max(1, n - 1)) for i in range(n)})


async def probe_hash(client: httpx.AsyncClient, url: str, model: str, tokenizer: Any) -> str:
    """sha256 of what the server's tokenizer does to the probe texts and ids.

    Raises:
        EngineError: the server refuses a probe (e.g. an id outside its vocabulary).
    """
    ids_seen = []
    for text in PROBE_TEXTS:
        out = await _post(client, url, "/tokenize",
                          {"model": model, "prompt": text, "add_special_tokens": False})  # fmt: skip
        ids_seen.append(out["tokens"])
    texts = []
    ids = probe_ids(len(tokenizer))
    for start in range(0, len(ids), 64):
        out = await _post(client, url, "/detokenize",
                          {"model": model, "tokens": ids[start : start + 64]})  # fmt: skip
        texts.append(out["prompt"])
    return hashlib.sha256(json.dumps([ids_seen, texts]).encode()).hexdigest()


def local_probe_hash(tokenizer: Any) -> str:
    """:func:`probe_hash` computed with the local tokenizer."""
    ids_seen = [tokenizer.encode(t, add_special_tokens=False) for t in PROBE_TEXTS]
    ids = probe_ids(len(tokenizer))
    texts = [
        tokenizer.decode(ids[s : s + 64], skip_special_tokens=False) for s in range(0, len(ids), 64)
    ]
    return hashlib.sha256(json.dumps([ids_seen, texts]).encode()).hexdigest()


async def check_server(client: httpx.AsyncClient, url: str, tokenizer: Any) -> ServerInfo:
    """Check one replica (see the module docstring) and return what it serves.

    Raises:
        EngineError: unreachable, raw log-probs, another tokenizer, or no base model.
    """
    from clawrl.models import tokenizer_fingerprint

    try:
        r = await client.get(f"{url}/v1/models")
    except httpx.HTTPError as e:
        raise EngineError(f"vLLM at {url} is unreachable: {e}") from e
    if r.status_code != 200:
        raise EngineError(f"vLLM at {url}/v1/models answered HTTP {r.status_code}")
    model, max_len, root = _base_model(r.json(), url)
    remote = _local_fingerprint(root)
    if remote is not None:
        if remote != tokenizer_fingerprint(tokenizer):
            raise EngineError(
                f"vLLM at {url} serves {root}, whose tokenizer ({remote}) is not the policy's "
                f"({tokenizer_fingerprint(tokenizer)}): token ids would mean other text"
            )
        how = "fingerprint"
    else:
        if await probe_hash(client, url, model, tokenizer) != local_probe_hash(tokenizer):
            raise EngineError(
                f"vLLM at {url} serves {root}, whose tokenizer maps the probe texts and ids "
                "differently from the policy's: token ids would mean other text"
            )
        how = "probe"
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else 0
    await check_logprobs_mode(client, url, model, int(bos))
    plugin = await check_prompt_temperature(client, url, model, temperature_probe_ids(tokenizer))
    return ServerInfo(url, model, max_len, root, how, plugin)
