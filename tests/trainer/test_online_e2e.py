"""The online loop end to end: the openai SDK talks to the gateway while it trains.

Tiny model, scripted judge (the judge is not under test here; its own tests cover it), built by
the composition root every command uses (:func:`clawrl.runtime.build_runtime`).
"""

from __future__ import annotations

import time

import openai
import pytest

from clawrl.config import load_config
from clawrl.judge.types import BackendKind, Hint, HintSelection, Judgment, Score
from clawrl.models import tiny_policy
from clawrl.runtime import JudgeBundle, build_runtime
from clawrl.trainer.metrics import read_metrics


async def scripted_judge(inp):
    """+1 when the user thanks, else -1 with a hint."""
    if "thanks" in inp.next_state.text:
        return Judgment(score=Score.GOOD, backend=BackendKind.GENERATIVE, model="scripted")
    return Judgment(
        score=Score.BAD,
        backend=BackendKind.GENERATIVE,
        model="scripted",
        hint=Hint(text="Answer in one short sentence.", selection=HintSelection.SINGLE),
    )


def _wait(cond, timeout_s=90.0):
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@pytest.mark.timeout(300)
def test_two_training_steps_while_serving(tmp_path):
    policy = tiny_policy(seed=7, max_context=1024)
    cfg = load_config(None, [
        'trainer.method="combine"', "trainer.batch_size=3", "trainer.poll_interval_s=0.1",
        "trainer.lr=1e-3", "trainer.micro_batch_size=2", f'trainer.output_dir="{tmp_path / "out"}"',
    ])  # fmt: skip
    runtime = build_runtime(
        cfg, policy=policy, store=tmp_path / "s.db", judge=JudgeBundle(scripted_judge),
        model_name="tiny",
    )  # fmt: skip
    service, engine, store = runtime.service, runtime.engine, runtime.store
    assert service is not None
    lines: list[str] = []
    service.on_step(lambda m: lines.append(service.step_line(m)))
    server = runtime.serve()
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    try:
        versions_seen = []
        for s in range(4):
            sid = f"sess-{s}"
            messages = [{"role": "user", "content": f"what is {s} + {s}?"}]
            for t in range(3):
                r = client.chat.completions.with_raw_response.create(
                    model="tiny", messages=messages, max_tokens=6, temperature=1.0,
                    extra_headers={"X-Session-Id": sid},
                )  # fmt: skip
                completion = r.parse()
                versions_seen.append(int(completion.system_fingerprint.split("-v")[-1]))
                answer = completion.choices[0].message.content or ""
                reply = "thanks!" if (s + t) % 2 == 0 else "no, that is wrong, redo it"
                messages += [{"role": "assistant", "content": answer},
                             {"role": "user", "content": reply}]  # fmt: skip
            httpx_end = client.post(f"/sessions/{sid}/end", cast_to=object, body={})
            assert httpx_end is not None
        assert _wait(lambda: service.trainer.step >= 2), service.status()
        assert _wait(lambda: engine.policy_version >= 2)
        after = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert after.system_fingerprint.endswith(f"-v{engine.policy_version}")
    finally:
        server.stop()
        engine.close()
    counts = store.sample_counts()
    assert counts["trained"] >= 6  # two steps of batch 3
    assert counts.get("drop/no_next_state", 0) >= 1  # the last turn of an ended session
    # every turn records the version that sampled it, and versions only increase in time
    turns = sorted(
        (t for sid in store.session_ids() for t in store.session_turns(sid)),
        key=lambda t: t.created_at,
    )
    assert [t.policy_version for t in turns] == sorted(t.policy_version for t in turns)
    assert versions_seen[0] == 0
    assert lines[0].startswith("step 1: policy v1 | loss ") and "judged" in lines[0]
    rows = read_metrics(tmp_path / "out" / "metrics.jsonl")
    assert [r["step"] for r in rows][:2] == [1, 2]
    assert rows[1]["policy/version"] == 2.0 and rows[0]["hint/rate"] >= 0.0
    runtime.close()
