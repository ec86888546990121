"""Run as a script by test_store_durability: record turns forever, printing each acked id.

Usage: python store_writer_proc.py DB_PATH SESSION_ID

A line is printed only after ``record_turn`` returned, i.e. after the write was committed; the
test kills this process with SIGKILL and checks that every printed id is in the store, intact.
"""

from __future__ import annotations

import sys

from clawrl.store import SessionSource, Store, TurnRecord


def expected_turn(session_id: str, i: int) -> TurnRecord:
    """The deterministic turn number ``i`` (the test rebuilds it to compare)."""
    prompt = [(i * 31 + k) % 50000 for k in range(200 + i % 7)]
    completion = [(i * 17 + k) % 50000 for k in range(1 + i % 13)]
    logprobs = [-(i + k) / 7.0 for k in range(len(completion))]
    return TurnRecord(
        session_id=session_id,
        prompt_ids=prompt,
        completion_ids=completion,
        sampling_logprobs=logprobs,
        id=f"turn-{i:06d}",
        request_messages=[{"role": "user", "content": f"message {i}"}],
        output={"content": f"answer {i}"},
        created_at=1000.0 + i,
    )


def main() -> None:
    path, session_id = sys.argv[1], sys.argv[2]
    with Store(path) as store:
        store.get_or_create_session(session_id, SessionSource.HARNESS)
        i = 0
        while True:
            store.record_turn(expected_turn(session_id, i))
            sys.stdout.write(f"turn-{i:06d}\n")
            sys.stdout.flush()
            i += 1


if __name__ == "__main__":
    main()
