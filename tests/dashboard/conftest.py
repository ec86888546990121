"""A live gateway on the tiny model, training online with a scripted judge, for the dashboard.

The traffic is real: the openai SDK talks to ``/v1/chat/completions`` with session headers, the
user's replies become next states, the scripted judge scores them (+1 for thanks, -1 with a hint
otherwise; the judge is not under test here) and the trainer takes a step of 2 samples.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from clawrl.config import load_config
from clawrl.judge.types import BackendKind, Hint, HintSelection, Judgment, Score
from clawrl.models import tiny_policy
from clawrl.runtime import JudgeBundle, build_runtime

HINT = "Answer in one short sentence."
TRICKY = '<script>window.__pwned = 1</script><img src=x onerror="window.__pwned=2"> & "quotes"'


async def scripted_judge(inp):
    """+1 when the user thanks, else -1 with a hint (the hostile text itself for it)."""
    if "thanks" in inp.next_state.text:
        return Judgment(score=Score.GOOD, backend=BackendKind.GENERATIVE, model="scripted")
    hint = TRICKY if TRICKY in inp.next_state.text else HINT
    return Judgment(
        score=Score.BAD, backend=BackendKind.GENERATIVE, model="scripted",
        hint=Hint(text=hint, selection=HintSelection.SINGLE),
    )  # fmt: skip


def wait_for(cond, timeout_s: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@dataclass
class Live:
    runtime: Any
    server: Any
    client: openai.OpenAI
    url: str

    def converse(self, sid: str, replies: list[str], first: str = "what is 2 + 2?",
                 user_agent: str | None = None, user: str | None = None) -> None:  # fmt: skip
        """One conversation: the first message, then each reply after the policy's answer;
        then the session is ended (its last answer never gets a next state)."""
        messages = [{"role": "user", "content": first}]
        headers = {"X-Session-Id": sid} | ({"User-Agent": user_agent} if user_agent else {})
        headers |= {"x-clawrl-user": user} if user else {}
        for reply in [*replies, None]:
            r = self.client.chat.completions.create(
                model="tiny", messages=messages, max_tokens=6, temperature=1.0,
                extra_headers=headers,
            )  # fmt: skip
            if reply is None:
                break
            messages += [{"role": "assistant", "content": r.choices[0].message.content or ""},
                         {"role": "user", "content": reply}]  # fmt: skip
        self.client.post(f"/sessions/{sid}/end", cast_to=object, body={})

    def steps(self) -> int:
        """Steps whose metrics row is written and whose version is served (what the dashboard
        can show; the trainer's counter moves a moment earlier)."""
        rows = len(self.runtime.dashboard.metrics())
        return min(rows, self.runtime.engine.policy_version)


@pytest.fixture(scope="package")
def live(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dashboard")
    cfg = load_config(None, [
        'trainer.method="rl"', "trainer.batch_size=2", "trainer.micro_batch_size=2",
        "trainer.poll_interval_s=0.1", "trainer.lr=1e-3", f'trainer.output_dir="{tmp / "out"}"',
    ])  # fmt: skip
    runtime = build_runtime(
        cfg, policy=tiny_policy(seed=3, max_context=1024), store=tmp / "store.db",
        judge=JudgeBundle(scripted_judge, description="scripted x1"), model_name="tiny",
    )  # fmt: skip
    lines: list[list[Any]] = []
    runtime.app.state.gateway.turn_listeners.append(lines.append)
    server = runtime.serve()
    client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    live = Live(runtime, server, client, f"{server.url}/dashboard")
    live.recorded = lines  # type: ignore[attr-defined]
    try:
        live.converse("dash-one", ["no, that is wrong, redo it", "thanks!"], user="alice")
        live.converse("dash-two", [TRICKY], first=f"explain {TRICKY}", user_agent=TRICKY)
        # a step, and the judge worker has seen both sessions' last answers (no next state)
        assert wait_for(lambda: live.steps() >= 1
                        and runtime.store.sample_counts().get("drop/no_next_state", 0) >= 2
                        ), runtime.service.status()  # fmt: skip
        yield live
    finally:
        server.stop()
        runtime.close()
