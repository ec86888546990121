"""A client that disconnects mid-stream leaves an incomplete turn that is never trained on."""

from __future__ import annotations

import time

import httpx
import pytest

from clawrl.store import TurnStatus, UntrainableReason
from clawrl.trajectory import load_tree, training_rows


def _read_then_close(url, body, chunks):
    """Read ``chunks`` data lines of a stream, then drop the connection; return the turn id."""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as r:
        assert r.status_code == 200
        turn_id = r.headers["x-clawrl-turn-ids"]
        seen = 0
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen += 1
                if seen == chunks:
                    break
    return turn_id


def _wait_for_turn(store, turn_id, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        turn = store.get_turn(turn_id)
        if turn is not None:
            return turn
        time.sleep(0.05)
    raise AssertionError(f"turn {turn_id} was never recorded")


def _assert_incomplete(store, turn, full_len):
    assert turn.status == TurnStatus.INCOMPLETE
    assert turn.finish_reason == "aborted"
    assert not turn.trainable and turn.untrainable_reason == UntrainableReason.INCOMPLETE
    assert 3 <= len(turn.completion_ids) < full_len
    assert len(turn.sampling_logprobs) == len(turn.completion_ids)
    (row,) = training_rows(load_tree(store, turn.session_id))
    assert sum(row.loss_mask) == 0
    assert row.untrained == {turn.id: UntrainableReason.INCOMPLETE}


def test_disconnect_mid_stream_records_an_incomplete_turn(scripted_server):
    reply = " ".join(f"w{i}" for i in range(150))
    served = scripted_server([reply], token_delay_s=0.01)
    full_len = len(served.engine.script_ids(reply))
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Talk."}], "stream": True}
    turn = _wait_for_turn(served.store, _read_then_close(served.url, body, chunks=4))
    _assert_incomplete(served.store, turn, full_len)
    deadline = time.monotonic() + 5
    while served.engine.cancelled == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert served.engine.cancelled == 1  # the engine request was closed early


def test_disconnect_on_the_real_engine_cancels_the_request(tiny_server):
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Talk for a long time."}],
        "stream": True,
        "max_tokens": 1500,
        "temperature": 1.0,
    }
    turn = _wait_for_turn(tiny_server.store, _read_then_close(tiny_server.url, body, chunks=4))
    _assert_incomplete(tiny_server.store, turn, 1500)
    deadline = time.monotonic() + 5
    while tiny_server.engine.stats.batch_size and time.monotonic() < deadline:
        time.sleep(0.02)
    assert tiny_server.engine.stats.batch_size == 0


def test_non_stream_client_timeout_cancels_and_records_incomplete(tmp_path):
    """A non-streamed request whose client gives up stops generating and is never trained."""
    import time as _time

    import httpx

    from clawrl.engine import TransformersEngine
    from clawrl.gateway import create_app
    from clawrl.gateway.server import LiveServer
    from clawrl.models import tiny_policy
    from clawrl.store import Store, TurnStatus

    policy = tiny_policy(seed=3, max_context=4096)
    engine = TransformersEngine.from_policy(policy)
    store = Store(tmp_path / "s.db")
    server = LiveServer(create_app(engine, policy.tokenizer, store, model_name="t")).start()
    try:
        body = {"model": "t", "max_tokens": 3000, "ignore_eos": True,
                "messages": [{"role": "user", "content": "go on forever"}]}  # fmt: skip
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(server.base_url + "/chat/completions", json=body, timeout=1.5)
        deadline = _time.monotonic() + 30
        turns = []
        while _time.monotonic() < deadline:
            turns = [t for sid in store.session_ids() for t in store.session_turns(sid)]
            if turns:
                break
            _time.sleep(0.2)
        assert len(turns) == 1
        assert turns[0].status == TurnStatus.INCOMPLETE and not turns[0].trainable
        # generation stopped: the engine drops the row at its next step, which may come after
        # the turn is recorded on a loaded machine
        while engine._rows and _time.monotonic() < deadline:
            _time.sleep(0.05)
        assert not engine._rows and engine.stats.generated_tokens < 3000  # cut short
    finally:
        server.stop()
        engine.close()
        store.close()
