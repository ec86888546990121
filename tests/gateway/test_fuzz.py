"""Property-based fuzzing of the three protocols against a live gateway on the tiny model.

Generated bodies mix well-formed requests with wrong types, out-of-range numbers, odd unicode,
unknown fields and broken structure. Properties: never a 5xx; every error in its protocol's
shape; every recorded turn's ids, log-probs and loss mask agree. CI runs a bounded number of
examples (``CLAWRL_FUZZ_EXAMPLES``, default 40 per protocol);
``benchmarks/fuzz_gateway.py`` runs thousands.
"""

from __future__ import annotations

import math
import os

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawrl.store import TurnStatus

EXAMPLES = int(os.environ.get("CLAWRL_FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    database=None,
    # CI: the same examples every run (a failure reproduces); the benchmark script randomises
    derandomize=os.environ.get("CLAWRL_FUZZ_RANDOM") != "1",
)

text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40
) | st.sampled_from(
    ["", "\x00", "a\ud800b", "<think>", "</think>", "<tool_call>{", "\u202e", "🙂" * 5]
)
junk = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | text
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.lists(st.integers(), max_size=3)
    | st.dictionaries(text, st.integers(), max_size=2)
)
number = st.floats(-5, 5) | st.integers(-3, 2**65) | junk


def body_of(required, optional):
    """Bodies built from valid field values (``required`` always, ``optional`` sometimes), then
    mutated: left valid, one field replaced by junk, one required field dropped, an unknown
    field added, or every field junk."""

    @st.composite
    def build(draw):
        out = {k: draw(v) for k, v in required.items()}
        for k, v in optional.items():
            if draw(st.booleans()):
                out[k] = draw(v)
        mode = draw(st.sampled_from(["valid", "valid", "junk_one", "drop", "unknown", "all_junk"]))
        keys = sorted(out)
        if mode == "junk_one":
            out[draw(st.sampled_from(keys))] = draw(junk)
        elif mode == "drop":
            out.pop(draw(st.sampled_from(sorted(required))))
        elif mode == "unknown":
            out[draw(text)] = draw(junk)
        elif mode == "all_junk":
            out = {k: draw(junk) for k in keys}
        return out

    return build()


content = text | st.lists(
    st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url", "bogus"]), "text": text}),
    max_size=2,
)
chat_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "user", "assistant", "system", "tool", "developer", "x"]),
     "content": content},
    optional={"tool_call_id": text, "name": text},
)  # fmt: skip
user_first = st.builds(
    lambda first, rest: [{"role": "user", "content": first}, *rest],
    text, st.lists(chat_message, max_size=2),
)  # fmt: skip
temperature = st.floats(0, 2) | st.sampled_from([0, 1e-40, 1e-6, 2.0]) | number
CHAT = body_of(
    {"model": st.just("tiny"), "messages": user_first, "max_tokens": st.integers(1, 6)},
    {"temperature": temperature, "top_p": st.floats(0.01, 1) | number,
     "top_k": st.integers(-2, 60), "n": st.integers(1, 3),
     "seed": st.integers(-(2**66), 2**66), "stop": text | st.lists(text, max_size=5),
     "logprobs": st.booleans(), "top_logprobs": st.integers(0, 20), "stream": st.booleans(),
     "tools": st.lists(st.fixed_dictionaries({"type": st.just("function"), "function": junk}),
                       max_size=1)},
)  # fmt: skip
anthropic_block = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "text", "tool_use", "tool_result", "image", "thinking"]),
     "text": text},
    optional={"id": text, "tool_use_id": text, "name": text, "input": junk, "content": junk},
)  # fmt: skip
MESSAGES = body_of(
    {"model": st.just("tiny"), "max_tokens": st.integers(1, 6),
     "messages": st.builds(lambda c: [{"role": "user", "content": c}],
                           text | st.lists(anthropic_block, min_size=1, max_size=2))},
    {"system": text | st.lists(anthropic_block, max_size=1), "temperature": temperature,
     "top_k": st.integers(-2, 60), "stop_sequences": st.lists(text, max_size=3),
     "stream": st.booleans(),
     "thinking": st.fixed_dictionaries({"type": st.sampled_from(["enabled", "disabled"])})},
)  # fmt: skip
RESPONSES = body_of(
    {"model": st.just("tiny"), "max_output_tokens": st.integers(1, 6),
     "input": text | st.lists(st.fixed_dictionaries(
         {"role": st.sampled_from(["user", "assistant", "system"]), "content": content}),
         min_size=1, max_size=3)},
    {"instructions": text, "temperature": temperature, "stream": st.booleans(),
     "store": st.booleans(), "previous_response_id": text},
)  # fmt: skip


def _check(served, path: str, body: dict) -> int:
    try:
        r = httpx.post(f"{served.url}{path}", json=body, timeout=120)
    except ValueError:  # the body itself is not JSON (NaN): send it as text instead
        import json

        r = httpx.post(f"{served.url}{path}", timeout=120, headers={"Content-Type":
                       "application/json"}, content=json.dumps(body).encode())  # fmt: skip
    assert r.status_code < 500, f"{r.status_code} for {body!r}: {r.text[:300]}"
    if r.status_code >= 400:
        err = r.json()
        if path == "/v1/messages":
            assert err["type"] == "error" and set(err["error"]) >= {"type", "message"}, err
        else:
            assert set(err["error"]) == {"message", "type", "param", "code"}, err
        assert err["error"]["message"]
    return r.status_code


def _records_agree(served) -> None:
    for turn in served.turns():
        assert len(turn.completion_ids) == len(turn.sampling_logprobs), turn.id
        assert all(math.isfinite(x) for x in turn.sampling_logprobs), turn.id
        if turn.trainable:
            assert turn.status == TurnStatus.OK and turn.completion_ids, turn.id
        assert turn.status != TurnStatus.OK or turn.output is not None, turn.id


@pytest.mark.parametrize(
    ("path", "strategy"),
    [("/v1/chat/completions", CHAT), ("/v1/messages", MESSAGES), ("/v1/responses", RESPONSES)],
    ids=["chat", "messages", "responses"],
)
def test_fuzzed_bodies_never_500_and_leave_consistent_records(tiny_server, path, strategy):
    codes: list[int] = []

    @FUZZ
    @given(body=strategy)
    def run(body):
        codes.append(_check(tiny_server, path, body))

    run()
    _records_agree(tiny_server)
    ok, refused = sum(c < 300 for c in codes), sum(400 <= c < 500 for c in codes)
    print(f"fuzz {path}: {len(codes)} bodies, {ok} answered, {refused} refused (4xx), 0 5xx")
    assert ok and refused, "the generated bodies must exercise both answers and refusals"
