"""JudgeWorker: next states from the store become stored judgments (scripted judge)."""

from __future__ import annotations

import asyncio

from clawrl.judge.types import BackendKind, Judgment, Score
from clawrl.judge.worker import JudgeWorker
from clawrl.store import JudgmentRecord, Store, TurnRecord


def _session(store, tok, reply="thanks, that's perfect"):
    s = store.new_session()
    q = [{"role": "system", "content": "be nice"}, {"role": "user", "content": "2+2?"}]
    p1 = tok.apply_chat_template(q, add_generation_prompt=True, return_dict=False)
    c1 = tok.encode("**4**<|im_end|>")
    t1 = TurnRecord(
        s.id,
        p1,
        c1,
        [-0.5] * len(c1),
        request_messages=q,
        output={"content": "**4**", "tool_calls": []},
    )
    store.record_turn(t1)
    env = tok.encode(f"\n<|im_start|>user\n{reply}<|im_end|>\n<|im_start|>assistant\n")
    msgs2 = [*q, {"role": "assistant", "content": "**4**"}, {"role": "user", "content": reply}]
    c2 = tok.encode("ok<|im_end|>")
    t2 = TurnRecord(
        s.id,
        p1 + c1 + env,
        c2,
        [-0.1] * len(c2),
        request_messages=msgs2,
        output={"content": "ok", "tool_calls": []},
    )
    store.record_turn(t2)
    return s.id, t1.id, t2.id


def test_worker_judges_turns_with_a_next_state(tmp_path, tokenizer):
    seen = []

    async def judge(inp):
        seen.append(inp)
        return Judgment(score=Score.GOOD, backend=BackendKind.GENERATIVE, model="stub")

    with Store(tmp_path / "s.db") as store:
        sid, t1, t2 = _session(store, tokenizer)
        worker = JudgeWorker(store, judge)
        assert asyncio.run(worker.poll_once()) == 1  # t2 has no next state yet
        j = store.get_judgment(t1)
        assert j.score == 1 and j.next_state_role == "user" and j.backend == "generative:stub"
        inp = seen[0]
        assert inp.context.system == "be nice" and inp.context.user == "2+2?"
        assert inp.output.content == "**4**"
        assert inp.next_state.text == "thanks, that's perfect"
        assert store.get_judgment(t2) is None
        store.end_session(sid)
        assert asyncio.run(worker.poll_once()) == 0
        assert store.get_judgment(t2).reason == "no_next_state"
        assert store.sessions_with_unjudged_turns() == []


def test_feedback_is_a_next_state_and_a_slow_judge_times_out(tmp_path, tokenizer):
    async def slow(inp):
        await asyncio.sleep(5)

    with Store(tmp_path / "s.db") as store:
        _, t1, t2 = _session(store, tokenizer)
        store.add_feedback(-1.0, turn_id=t2, comment="wrong")
        worker = JudgeWorker(store, slow, timeout_s=0.2)
        assert asyncio.run(worker.poll_once()) == 2
        for t in (t1, t2):
            j = store.get_judgment(t)
            assert j.score is None and j.reason == "timeout"
        assert store.get_judgment(t2).next_state_role == "feedback"


def test_the_first_stored_verdict_wins_when_two_workers_judge_a_turn(tmp_path, tokenizer):
    # worker B reads the turn as unjudged; while its judge runs, worker A stores a verdict
    # (another process, or the worker's own earlier life before a kill -9): B keeps A's
    with Store(tmp_path / "s.db") as store:
        _, t1, _ = _session(store, tokenizer)

        async def late(inp):
            store.record_judgment(JudgmentRecord(t1, store.get_turn(t1).session_id, -1, "A"))
            return Judgment(score=Score.GOOD, backend=BackendKind.GENERATIVE, model="B")

        lines = []
        worker = JudgeWorker(store, late)
        worker.on_judgment = lines.append
        asyncio.run(worker.poll_once())
        j = store.get_judgment(t1)
        assert j.score == -1 and j.backend == "A"
        assert worker.duplicates == 1 and worker.judged == 0 and lines == []
        stored = store.record_judgment(JudgmentRecord(t1, j.session_id, 1, "C"), replace=False)
        assert not stored and store.get_judgment(t1).backend == "A"
        assert store.record_judgment(JudgmentRecord(t1, j.session_id, 1, "C"))  # replace
        assert store.get_judgment(t1).backend == "C"


def test_a_turn_another_worker_claimed_is_skipped_unless_that_worker_died_here(tmp_path, tokenizer):
    import socket
    import subprocess
    import sys

    from clawrl.store.leases import judge_claim

    async def judge(inp):
        return Judgment(score=Score.GOOD, backend=BackendKind.GENERATIVE, model="stub")

    with Store(tmp_path / "s.db") as store:
        _, t1, _ = _session(store, tokenizer)
        store.acquire_lease(judge_claim(t1), "other-host:1:live", 60)
        worker = JudgeWorker(store, judge)
        asyncio.run(worker.poll_once())
        assert store.get_judgment(t1) is None and worker.claimed_elsewhere == 1
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        dead = f"{socket.gethostname()}:{gone.pid}:killed"
        store.acquire_lease(judge_claim(t1), dead, 60, force=True)
        asyncio.run(worker.poll_once())
        assert store.get_judgment(t1).score == 1  # taken over at once, judged
        assert store.get_lease(judge_claim(t1)) is None  # and released


def test_observations_judges_a_harness_user_message_as_program_output(tmp_path, tokenizer):
    """Harness mode: the harness sends a command's output as a user message; the judge reads
    it as the environment's output (its exit-status rule applies), and the stored judgment
    records the role read. Without ``observations`` (the online loop) it stays a user reply."""
    seen = []

    async def judge(inp):
        seen.append(inp.next_state.role)
        return Judgment(score=Score.BAD, backend=BackendKind.HEAD, model="stub")

    output = "Output:\nsh: 1: nano: not found\n\n(exit code 127)"
    for observations, role in ((True, "environment"), (False, "user")):
        with Store(tmp_path / f"s-{observations}.db") as store:
            _, t1, _ = _session(store, tokenizer, reply=output)
            worker = JudgeWorker(store, judge, observations=observations)
            assert asyncio.run(worker.poll_once()) == 1
            assert store.get_judgment(t1).next_state_role == role
            assert seen[-1] == role


def test_observations_leave_a_harness_correction_a_user_message(tmp_path, tokenizer):
    """mini-swe-agent's "Reply with one shell command" after a reply without one reports no
    exit status: it stays a user message (a correction) even in harness mode."""
    seen = []

    async def judge(inp):
        seen.append(inp.next_state.role)
        return Judgment(score=Score.BAD, backend=BackendKind.HEAD, model="stub")

    with Store(tmp_path / "s.db") as store:
        reply = "Reply with one shell command in a ```bash block."
        _, t1, _ = _session(store, tokenizer, reply=reply)
        assert asyncio.run(JudgeWorker(store, judge, observations=True).poll_once()) == 1
        assert store.get_judgment(t1).next_state_role == "user" and seen == ["user"]
