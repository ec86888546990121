"""One conversation through a load balancer in front of several clawrl replicas.

Each call goes to whichever replica the balancer picks (nginx's round robin alternates them);
the conversation sends no session id, so the replicas attribute it by its prompt: every call
extends the previous call's prompt and answer, which one replica or the other recorded in the
shared store. At the end it prints, per call, the replica that answered and the session and
policy version it was recorded with: one session.

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 python examples/replicas/conversation.py [--calls 6]
"""

from __future__ import annotations

import argparse
import os

import openai


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--end", action="store_true", help="end the session afterwards")
    args = ap.parse_args()
    base = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
    client = openai.OpenAI(base_url=base, api_key=os.environ.get("OPENAI_API_KEY", "x"))
    messages = [{"role": "user", "content": "What is 12 times 7? Answer briefly."}]
    replies = ["Thanks! Now 12 times 8?", "No, that is wrong. Try again, shorter.",
               "Great, thanks. And 12 times 9?"]  # fmt: skip
    sessions = set()
    for k in range(args.calls):
        raw = client.chat.completions.with_raw_response.create(
            model="policy", messages=messages, max_tokens=args.max_tokens, temperature=0.7
        )
        completion = raw.parse()
        answer = completion.choices[0].message.content or ""
        session = raw.headers.get("x-clawrl-session-id")
        sessions.add(session)
        print(f"call {k + 1}: replica {raw.headers.get('x-clawrl-upstream', '?'):<16} "
              f"session {session} turn {raw.headers.get('x-clawrl-turn-ids')} "
              f"{completion.system_fingerprint}: {answer[:60]!r}")  # fmt: skip
        messages += [{"role": "assistant", "content": answer},
                     {"role": "user", "content": replies[k % len(replies)]}]  # fmt: skip
    if args.end and len(sessions) == 1:
        client.post(f"/sessions/{sessions.pop()}/end", cast_to=object, body={})
    print(f"{len(sessions) if sessions else 1} session(s)")


if __name__ == "__main__":
    main()
