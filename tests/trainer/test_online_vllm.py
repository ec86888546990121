"""The online loop with vLLM as the policy engine (``clawrl serve --engine vllm --method combine``):
the openai SDK talks to the gateway, the gateway generates on a real vLLM server, the trainer
publishes LoRA versions into it, and every turn records the version that produced it.

The embedded model (what the session's vLLM server serves) and a scripted judge (the judge is
not under test here).
"""

from __future__ import annotations

import copy
import time

import openai
import pytest
import torch
from peft import PeftModel

from clawrl.config import load_config
from clawrl.judge.types import BackendKind, Hint, HintSelection, Judgment, Score
from clawrl.runtime import JudgeBundle, build_runtime
from clawrl.trainer import TrainSample, collate, token_logprobs


async def scripted_judge(inp):
    """+1 when the user thanks, else -1 with a hint (so Combined has rewards and OPD)."""
    if "thanks" in inp.next_state.text:
        return Judgment(score=Score.GOOD, backend=BackendKind.GENERATIVE, model="scripted")
    hint = Hint(text="Answer in one short sentence.", selection=HintSelection.SINGLE)
    return Judgment(score=Score.BAD, backend=BackendKind.GENERATIVE, model="scripted", hint=hint)


@pytest.mark.timeout(900)
def test_versions_advance_on_vllm_while_serving(
    vllm_server, embedded_policy, _embedded_policy_once, tmp_path
):
    cfg = load_config(None, [
        'engine.backend="vllm"', f'engine.vllm_urls=["{vllm_server.url}"]',
        'trainer.method="combine"', "trainer.batch_size=2", "trainer.poll_interval_s=0.1",
        "trainer.lr=1e-3", "trainer.micro_batch_size=2", f'trainer.output_dir="{tmp_path}"',
    ])  # fmt: skip
    runtime = build_runtime(
        cfg, policy=embedded_policy, store=tmp_path / "s.db", judge=JudgeBundle(scripted_judge),
        model_name="smol",
    )  # fmt: skip
    service, engine, store = runtime.service, runtime.engine, runtime.store
    assert service is not None and type(engine).__name__ == "VLLMEngine"
    server = runtime.serve()
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    try:
        for s in range(3):  # 3 sessions x 3 turns: 6 turns with a next state, 2 steps of 2
            sid = f"sess-{s}"
            messages = [{"role": "user", "content": f"what is {s} + {s}?"}]
            for t in range(3):
                stream = client.chat.completions.create(
                    model="smol", messages=messages, max_tokens=12, temperature=0.7,
                    stream=True, extra_headers={"X-Session-Id": sid},
                )  # fmt: skip
                answer = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
                reply = "thanks!" if (s + t) % 2 == 0 else "no, that is wrong, redo it"
                messages += [{"role": "assistant", "content": answer},
                             {"role": "user", "content": reply}]  # fmt: skip
            client.post(f"/sessions/{sid}/end", cast_to=object, body={})
        deadline = time.monotonic() + 600
        while (
            service.trainer.step < 2 or engine.policy_version < 2
        ) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert service.trainer.step >= 2 and engine.policy_version >= 2, service.status()
        after = client.chat.completions.create(
            model="smol", messages=[{"role": "user", "content": "hi"}], max_tokens=8,
            temperature=0.7, logprobs=True,
        )  # fmt: skip
        # the version that answered (the trainer may publish another one right after)
        answered = int(after.system_fingerprint.rsplit("-v", 1)[1])
        assert 2 <= answered <= engine.policy_version
    finally:
        server.stop()
    counts = store.sample_counts()
    assert counts["trained"] >= 4  # two steps of batch 2 (teacher scored by the trainer: auto)
    turns = sorted((t for sid in store.session_ids() for t in store.session_turns(sid)),
                   key=lambda t: t.created_at)  # fmt: skip
    assert [t.policy_version for t in turns] == sorted(t.policy_version for t in turns)
    assert turns[-1].policy_version == answered >= 2
    # the served version's log-probs are the trainer's: the last turn, scored by the adapter
    # the trainer published as that version (the trainer may have stepped on since)
    last = turns[-1]
    published = tmp_path / "policies" / f"v{last.policy_version}"
    model = PeftModel.from_pretrained(copy.deepcopy(_embedded_policy_once.model), str(published))
    batch = collate([TrainSample(last.prompt_ids, last.completion_ids, last.sampling_logprobs,
                                 temperature=0.7)])  # fmt: skip
    with torch.no_grad():
        trained, _ = token_logprobs(model.eval(), batch)
    diff = (trained[batch.loss_mask] - torch.tensor(last.sampling_logprobs)).abs().max()
    assert float(diff) < 1e-3, float(diff)
    runtime.close()
