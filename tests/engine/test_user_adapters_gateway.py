"""Per-user adapters end to end on the in-process engine: through the gateway (real requests,
recorded turns), each user is sampled from their own adapter, and a new version of one user's
adapter leaves another user's served log-probs bit-identical (same prompt, same seed)."""

from __future__ import annotations

import copy
import dataclasses

import httpx

from clawrl.engine import TransformersEngine
from clawrl.gateway import create_app
from clawrl.gateway.server import LiveServer
from clawrl.gateway.user_adapters import UserAdapters
from clawrl.models import tiny_policy
from clawrl.store import Store, UserAdapterRecord

from .conftest import trained_adapter


def test_users_are_served_their_own_adapter_and_isolated(tmp_path):
    policy = tiny_policy(seed=6, max_context=256)
    policy = dataclasses.replace(policy, model=copy.deepcopy(policy.model))
    paths = {}
    for seed in (1, 2, 3):
        paths[seed] = tmp_path / f"a{seed}"
        trained_adapter(policy.model, paths[seed], seed, rank=4, scale=0.2, weights="lora_")
    engine = TransformersEngine.from_policy(policy, max_adapters=4)
    store = Store(tmp_path / "s.db")
    store.publish_user_adapter(UserAdapterRecord("alice", 1, str(paths[1])))
    store.publish_user_adapter(UserAdapterRecord("bob", 1, str(paths[2])))
    app = create_app(engine, policy.tokenizer, store, model_name="tiny",
                     user_adapters=UserAdapters(store, engine, refresh_s=0))  # fmt: skip
    server = LiveServer(app).start()

    def ask(user: str | None):
        headers = {"x-clawrl-user": user} if user else {}
        r = httpx.post(f"{server.url}/v1/chat/completions", headers=headers, timeout=120, json={
            "model": "tiny", "messages": [{"role": "user", "content": "What is 2 + 2?"}],
            "max_tokens": 10, "temperature": 1.0, "seed": 7})  # fmt: skip
        assert r.status_code == 200, r.text
        (turn_id,) = r.headers["x-clawrl-turn-ids"].split(",")
        return store.get_turn(turn_id)

    try:
        alice, bob, carol = ask("alice"), ask("bob"), ask(None)
        assert (alice.adapter_version, bob.adapter_version, carol.adapter_version) == (1, 1, None)
        assert alice.prompt_ids == bob.prompt_ids == carol.prompt_ids
        # three different policies sampled them: the same seed gives different log-probs
        assert len({tuple(t.sampling_logprobs) for t in (alice, bob, carol)}) == 3
        store.publish_user_adapter(UserAdapterRecord("alice", 2, str(paths[3])))  # A's step
        alice2, bob2, carol2 = ask("alice"), ask("bob"), ask(None)
        assert alice2.adapter_version == 2
        assert alice2.sampling_logprobs != alice.sampling_logprobs
        for before, after in ((bob, bob2), (carol, carol2)):  # bit for bit
            assert (after.completion_ids, after.sampling_logprobs) == (
                before.completion_ids, before.sampling_logprobs)  # fmt: skip
    finally:
        server.stop()
        engine.close()
        store.close()
