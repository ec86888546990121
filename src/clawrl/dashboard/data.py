"""What the dashboard shows, read from the store and the trainer's output directory.

Every view is a JSON-ready dict built from what the online loop already writes: the trajectory
store (sessions, turns, judgments, trainer decisions) and ``OUTPUT_DIR/metrics.jsonl`` (one row
per training step, :class:`clawrl.trainer.metrics.MetricsWriter`). A live server adds its
in-memory counters (:class:`~clawrl.trainer.service.ServiceStatus`) and the demo adds its
evaluations and the judge's agreement with the simulated user; a finished run is read the
same way, from its files. Nothing here writes.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from clawrl.errors import StoreError
from clawrl.store import JudgmentRecord, SampleRecord, Store, TurnRecord, UntrainableReason
from clawrl.store.learning import DROP_EXPLANATIONS, SampleStatus
from clawrl.trajectory.next_state import next_state
from clawrl.trajectory.tree import SessionTree, load_tree

RATE_WINDOW_S = 60.0
"""Seconds of traffic that requests/s and tokens/s are averaged over."""

TEXT_LIMIT = 4000
"""Characters of one message, completion or next state sent to the browser (the rest is cut,
with a note)."""

PAGE_SIZE_MAX = 500
"""Most sessions one page of the sessions list holds."""

CACHE_S = 1.0
"""Seconds a view is reused: any number of open tabs costs the store one query set per view
per second."""

CACHE_ENTRIES = 64
"""Most views kept at once (expired ones are dropped first, then the oldest)."""

MAX_POINTS = 500
"""Points per curve sent to the browser (longer runs are thinned evenly, the last step kept)."""

CURVES = {
    "loss": "loss",
    "reward/mean": "reward mean",
    "kl/ref": "KL to the reference",
    "clip/low_frac": "clip fraction (low)",
    "clip/high_frac": "clip fraction (high)",
    "hint/rate": "hint rate",
    "time/step": "step time (s)",
}
"""metrics.jsonl keys drawn as curves on the training page, with their titles."""

UNTRAINABLE_WORDS: dict[str, str] = {
    UntrainableReason.INCOMPLETE: "the client disconnected before the answer finished",
    UntrainableReason.ERROR: "the engine failed or the prompt did not fit",
    UntrainableReason.PENDING: "generation never finished (the server stopped mid-answer)",
    UntrainableReason.STOP_STRING_MISMATCH: "a stop string cut the text in the middle of a token",
    UntrainableReason.NO_TOKEN_IDS: "the engine gave text without token ids",
    UntrainableReason.NO_COMPLETION: "no token was sampled",
    UntrainableReason.LOGPROBS_MISMATCH: "log-probs and sampled ids differ in length",
    UntrainableReason.MARKED_UNTRAINABLE: "recorded as untrainable without a reason",
    UntrainableReason.EVAL: "an evaluation request (greedy, measured, never trained)",
    UntrainableReason.TRUNCATED_SAMPLING: "sampled with top-k / top-p: its log-probs are of "
    "another distribution than the one trained",
    UntrainableReason.UNCLOSED_REASONING: "stopped inside an unclosed <think>",
    UntrainableReason.SIDE_CALL: "a side call (title, compaction, memory): data, never loss",
    UntrainableReason.USER_ADAPTER: "sampled with the user's own adapter: its log-probs are "
    "not the shared policy's",
    UntrainableReason.ABANDONED_RETRY: "the client sent the same call again later and nothing "
    "went on from this answer",
}
"""Every :class:`UntrainableReason` in words (a reason written by other code is shown as stored)."""


def _finite(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row with non-finite numbers as ``None`` (JSON has no NaN)."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}


def thin(points: list[list[Any]], most: int = MAX_POINTS) -> list[list[Any]]:
    """At most ``most`` of ``points``, evenly spaced, the first and the last kept."""
    if len(points) <= most:
        return points
    stride = (len(points) - 1) / (most - 1)
    return [points[round(i * stride)] for i in range(most)]


def _cut(text: str | None, limit: int = TEXT_LIMIT) -> str:
    if not text:
        return ""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[... {len(text) - limit} more characters]"


def _call_text(call: Any) -> str:
    """``→ name(arguments)`` of one tool call (OpenAI ``function`` shape or flat), arguments
    as JSON; anything else as its JSON text."""
    fn = call.get("function", call) if isinstance(call, dict) else None
    if not isinstance(fn, dict):
        return "→ " + _cut(json.dumps(call, ensure_ascii=False, default=str), 500)
    args = fn.get("arguments", "")
    if not isinstance(args, str):
        args = json.dumps(args, ensure_ascii=False, default=str)
    return f"→ {fn.get('name', '?')}({_cut(args, 500)})"


def message_text(message: Any) -> str:
    """A chat message's visible text: string content, text parts, tool calls and results (a
    malformed message, e.g. from a store written by other code, is shown as its JSON)."""
    if not isinstance(message, dict):
        return json.dumps(message, ensure_ascii=False, default=str)
    content = message.get("content")
    parts: list[str] = []
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for part in content:
            if not isinstance(part, dict):
                parts.append(json.dumps(part, ensure_ascii=False, default=str))
            elif isinstance(part.get("text"), str):
                parts.append(part["text"])
            elif part.get("type") in ("tool_result", "function_call_output"):
                inner = part.get("content", part.get("output"))
                parts.append(inner if isinstance(inner, str) else json.dumps(inner, default=str))
            elif part.get("type") == "tool_use":
                parts.append(_call_text({"name": part.get("name"), "arguments": part.get("input")}))
            elif part.get("type"):
                parts.append(f"[{part['type']}]")
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        parts.append(_call_text(call))
    return "\n".join(p for p in parts if p)


def _message(message: Any) -> dict[str, str]:
    role = message.get("role", "?") if isinstance(message, dict) else "?"
    return {"role": str(role), "text": _cut(message_text(message))}


def _output(turn: TurnRecord) -> dict[str, Any]:
    out = turn.output if isinstance(turn.output, dict) else {}
    calls = out.get("tool_calls")
    return {
        "content": _cut(out.get("content") if isinstance(out.get("content"), str) else ""),
        "reasoning": _cut(out.get("reasoning") if isinstance(out.get("reasoning"), str) else ""),
        "tool_calls": [_call_text(c)[2:] for c in (calls if isinstance(calls, list) else [])],
    }


def _new_messages(turn: TurnRecord, parent: TurnRecord | None) -> tuple[list[dict[str, str]], int]:
    """The turn's request messages a reader has not seen in its parent (its parent's messages
    and the parent's answer are skipped when they are a prefix), and how many were skipped."""
    msgs = turn.request_messages
    if parent is not None:
        k = len(parent.request_messages)
        if msgs[:k] == parent.request_messages and len(msgs) > k:
            skip = k + 1 if len(msgs) > k + 1 and msgs[k].get("role") == "assistant" else k
            return [_message(m) for m in msgs[skip:]], skip
    return [_message(m) for m in msgs], 0


def _judgment(j: JudgmentRecord | None) -> dict[str, Any] | None:
    if j is None:
        return None
    return {
        "score": j.score,
        "skipped": j.skipped,
        "reason": j.reason,
        "hint": j.hint,
        "backend": j.backend,
        "latency_s": j.latency_s,
        "votes": [
            {"score": v.get("score"), "abstain": v.get("abstain"), "hint": v.get("hint")}
            for v in j.votes
        ],
    }


def _training_state(
    node_trainable: bool,
    reason: str | None,
    sample: SampleRecord | None,
    judged: bool,
    judging: bool = True,
    has_next_state: bool = False,
) -> dict[str, Any]:
    """Whether a turn was trained, and why not, in words."""
    if sample is not None and sample.status == SampleStatus.TRAINED:
        return {
            "state": "trained",
            "step": sample.step,
            "version": sample.policy_version,
            "text": f"trained at step {sample.step} (produced policy v{sample.policy_version})",
        }
    if sample is not None:
        why = DROP_EXPLANATIONS.get(str(sample.reason), "")
        return {
            "state": "dropped",
            "reason": sample.reason,
            "text": f"not trained: {sample.reason}" + (f" ({why})" if why else ""),
        }
    if not node_trainable:
        why = UNTRAINABLE_WORDS.get(str(reason), "")
        return {
            "state": "untrainable",
            "reason": reason,
            "text": f"untrainable: {reason}" + (f" ({why})" if why else ""),
        }
    if judged:
        return {"state": "ready", "text": "judged; no training decision yet"}
    if not judging:
        return {
            "state": "recorded",
            "text": "recorded, not judged: no judge runs here (clawrl serve --method rl|opd|"
            "combine judges and trains)",
        }
    if has_next_state:
        return {"state": "waiting", "text": "has its next state; waiting for the judge"}
    return {"state": "waiting", "text": "waiting for its next state (the reply to it)"}


def _scored(counts: dict[str, int]) -> int:
    """Judgments with a verdict (+1, -1 or 0) in :meth:`Store.judgment_counts`."""
    return sum(counts.get(k, 0) for k in ("+1", "-1", "0"))


@dataclass
class DashboardSource:
    """Where the dashboard reads from.

    Attributes:
        store: the trajectory store (a live gateway's, or one opened for reading).
        output_dir: the trainer's output directory (``metrics.jsonl``, ``policies/v*``), or
            ``None`` when nothing trains.
        status: the live online loop's counters (``OnlineService.status``), or ``None``.
        policy_version: the version the engine serves now, or ``None`` (then the last
            published version in ``metrics.jsonl``).
        demo: the demo's live view (evaluations and examples, :func:`demo_view`), or ``None``.
        agreement: the judge's agreement with the simulated user's ground truth
            (:meth:`clawrl.envs.agreement.Agreement.to_dict`), where a scenario knows it.
        judging: whether a judge scores this store's turns (``clawrl serve`` without a
            training method records only: no backlog, no "waiting for the judge").
        title: shown in the page header (model and method).
        read_only: a dashboard over a finished run or a store in use by another process.
        started_at: when the server started (seconds since the epoch): a live server's
            request rate is averaged over its uptime until it has a full window.
        memory_enabled: whether the server adds the memory to prompts (``None``: unknown).
    """

    store: Store
    output_dir: Path | None = None
    status: Callable[[], Any] | None = None
    policy_version: Callable[[], int] | None = None
    demo: Callable[[], dict[str, Any] | None] | None = None
    agreement: Callable[[], dict[str, Any] | None] | None = None
    judging: bool = True
    title: str = "clawrl"
    read_only: bool = False
    memory_enabled: bool | None = None
    started_at: float = field(default_factory=time.time)
    _cache: dict[str, tuple[float, Any]] = field(default_factory=dict, repr=False)
    _metrics: tuple[int, list[dict[str, Any]]] = field(default=(0, []), repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # -- helpers -----------------------------------------------------------------------------

    def cached(self, key: str, build: Callable[[], Any]) -> Any:
        """``build()``, reused for :data:`CACHE_S` seconds under ``key``."""
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and now - hit[0] < CACHE_S:
                return hit[1]
        value = build()
        with self._lock:
            for old in [k for k, (t, _) in self._cache.items() if now - t >= CACHE_S]:
                del self._cache[old]
            while len(self._cache) >= CACHE_ENTRIES:
                del self._cache[min(self._cache, key=lambda k: self._cache[k][0])]
            self._cache[key] = (now, value)
        return value

    def metrics(self) -> list[dict[str, Any]]:
        """The trainer's per-step rows, read incrementally as ``metrics.jsonl`` grows (``[]``
        without an output directory). Rows without a ``step`` and a partly written last line
        are skipped; non-finite values become ``None``."""
        if self.output_dir is None:
            return []
        path = self.output_dir / "metrics.jsonl"
        try:
            size = path.stat().st_size
        except OSError:
            return []
        with self._lock:
            offset, rows = self._metrics
            if size < offset:  # the file was replaced: read it again
                offset, rows = 0, []
            if size > offset:
                with path.open("rb") as f:
                    f.seek(offset)
                    chunk = f.read(size - offset)
                end = chunk.rfind(b"\n") + 1  # only whole lines; the rest is being written
                rows = list(rows)
                for line in chunk[:end].splitlines():
                    try:
                        row = json.loads(line)
                    except (json.JSONDecodeError, UnicodeDecodeError):
                        continue
                    if isinstance(row, dict) and isinstance(row.get("step"), (int, float)):
                        rows.append(_finite(row))
                self._metrics = (offset + end, rows)
            return rows

    # -- views -------------------------------------------------------------------------------

    def overview(self) -> dict[str, Any]:
        """Policy version and its history, traffic rates, judge backlog, samples ready, drops
        (with words), the training step and the last step's metrics."""
        return dict(self.cached("overview", self._overview))

    def _overview(self) -> dict[str, Any]:
        now = time.time()
        # a live server averages over its own uptime until it has a full window
        window = (
            RATE_WINDOW_S if self.read_only else min(RATE_WINDOW_S, max(1.0, now - self.started_at))
        )
        act = self.store.activity(now - window)
        backlog = self.store.learning_backlog()
        counts = self.store.sample_counts()
        rows = self.metrics()
        versions = [
            {"version": int(r["policy/version"]), "step": int(r["step"]), "time": r.get("time")}
            for r in rows
            if r.get("policy/version") is not None
        ]
        # without metrics (no --output-dir), the store still knows the last step it trained
        stored_step, stored_version = self.store.training_progress()
        version = (
            self.policy_version()
            if self.policy_version is not None
            else (versions[-1]["version"] if versions else stored_version)
        )
        live = self.status() if self.status is not None else None
        drops = [
            {
                "reason": k.split("/", 1)[1],
                "count": v,
                "text": DROP_EXPLANATIONS.get(k.split("/", 1)[1], ""),
            }
            for k, v in sorted(counts.items())
            if k.startswith("drop/")
        ]
        last = rows[-1] if rows else None
        return {
            "title": self.title,
            "read_only": self.read_only,
            "now": now,
            "policy_version": version,
            "versions": versions[-50:],
            "rate_window_s": window,
            "requests_per_s": act["requests"] / window,
            "tokens_per_s": act["completion_tokens"] / window,
            "sessions": int(act["sessions_total"]),
            "turns": int(act["turns_total"]),
            "judging": self.judging,
            "judge_backlog": backlog["unjudged"] if self.judging else None,
            "judged": _scored(self.store.judgment_counts()),
            "samples_ready": live.ready if live is not None else backlog["ready"],
            "trained": counts.get("trained", 0),
            "drops": drops,
            "step": int(last["step"]) if last else stored_step,
            "metrics": self.output_dir is not None,
            "last_step": last,
            "live": live is not None,
        }

    def sessions(
        self, query: str = "", limit: int = 100, offset: int = 0, user: str | None = None
    ) -> dict[str, Any]:
        """One page of sessions, newest first, whose id, client, harness (metadata) or
        attribution contains ``query`` (case-insensitive) and that hold a turn of ``user``
        (exact id; ``None``: any user's), with the total that match. Each row lists its users.

        Raises:
            ValueError: ``limit`` outside 1..:data:`PAGE_SIZE_MAX` or a negative ``offset``.
        """
        if not 1 <= limit <= PAGE_SIZE_MAX or offset < 0:
            raise ValueError(f"limit must be 1..{PAGE_SIZE_MAX} and offset >= 0")
        q = query.strip()
        key = f"sessions:{q}:{limit}:{offset}:{'*' if user is None else 'u=' + user}"
        return dict(self.cached(key, lambda: self._sessions(q, limit, offset, user)))

    def _sessions(self, q: str, limit: int, offset: int, user: str | None) -> dict[str, Any]:
        rows = []
        page = self.store.list_sessions(limit=limit, offset=offset, query=q or None, user=user)
        for s in page:
            rec = s.session
            harness = rec.metadata.get("harness") if isinstance(rec.metadata, dict) else None
            rows.append({
                "id": rec.id,
                "client": rec.client or "",
                "users": list(s.user_ids),
                "harness": str(harness or ""),
                "attribution": rec.source.value,
                "turns": s.turns,
                "trainable": s.trainable_turns,
                "side": s.side_turns,
                "failed": s.failed_turns,
                "tokens": s.prompt_tokens + s.completion_tokens,
                "created_at": rec.created_at,
                "last_activity": s.last_turn_at or rec.created_at,
                "ended": rec.ended_at is not None,
            })  # fmt: skip
        total = self.store.count_sessions(q or None, user=user)
        return {"query": q, "user": user, "offset": offset, "limit": limit, "total": total,
                "sessions": rows}  # fmt: skip

    def session(self, session_id: str) -> dict[str, Any]:
        """One session as its prefix tree: per turn its new messages, completion, version, next
        state, the judge's votes, score and hint, and whether it was trained or why not.

        Raises:
            StoreError: unknown session.
        """
        return dict(self.cached(f"session:{session_id}", lambda: self._session(session_id)))

    def _session(self, session_id: str) -> dict[str, Any]:
        tree: SessionTree = load_tree(self.store, session_id)
        rec = self.store.get_session(session_id)
        if rec is None:  # pragma: no cover - load_tree raised already
            raise StoreError(f"unknown session {session_id!r}")
        judgments, samples = self.store.session_learning(session_id)
        turns = []
        for segment, roots in tree.segments().items():
            stack = list(reversed(roots))
            while stack:
                tid = stack.pop()
                node = tree.node(tid)
                turn = node.turn
                parent = tree.nodes[node.parent_id].turn if node.parent_id in tree.nodes else None
                new, skipped = _new_messages(turn, parent)
                state = next_state(tree, tid)
                j = judgments.get(tid)
                turns.append(
                    {
                        "id": turn.id,
                        "parent_id": node.parent_id,
                        "segment": segment,
                        "depth": node.depth,
                        "kind": turn.kind.value
                        if turn.side_kind is None
                        else f"{turn.kind.value}/{turn.side_kind}",
                        "root_reason": None if node.root_reason is None else node.root_reason.value,
                        "status": turn.status.value,
                        "finish_reason": turn.finish_reason,
                        "version": turn.policy_version,
                        "user": turn.user_id,
                        "adapter_version": turn.adapter_version,
                        "prompt_tokens": len(turn.prompt_ids),
                        "completion_tokens": len(turn.completion_ids),
                        "latency_s": turn.latency_s,
                        "error": None
                        if turn.error_kind is None and turn.error_message is None
                        else _cut(
                            f"{turn.error_kind or 'error'}: {turn.error_message or ''}", 2000
                        ),
                        "created_at": turn.created_at,
                        "attribution": turn.client.get("attribution"),
                        "messages": new,
                        "messages_skipped": skipped,
                        "output": _output(turn),
                        "next_state": None
                        if state is None
                        else {
                            "role": state.role.value,
                            "messages": [_message(m) for m in state.messages],
                            "child_turn_id": state.child_turn_id,
                            "feedback": [
                                {"reward": f.reward, "comment": f.comment} for f in state.feedback
                            ],
                            "note": state.note,
                        },
                        "judgment": _judgment(j),
                        "training": _training_state(
                            node.trainable,
                            None
                            if node.untrainable_reason is None
                            else str(node.untrainable_reason),
                            samples.get(tid),
                            j is not None,
                            self.judging,
                            state is not None,
                        ),
                    }
                )
                stack.extend(reversed(tree.ordered_children(tid)))
        return {
            "id": rec.id,
            "client": rec.client or "",
            "attribution": rec.source.value,
            "created_at": rec.created_at,
            "ended_at": rec.ended_at,
            "metadata": rec.metadata,
            "untrainable": tree.reason_counts(),
            "turns": turns,
        }

    def training(self) -> dict[str, Any]:
        """Per-step curves (:data:`CURVES`, thinned to :data:`MAX_POINTS`) and, in the demo,
        its evaluations."""
        return dict(self.cached("training", self._training))

    def _training(self) -> dict[str, Any]:
        rows = self.metrics()
        curves = {
            key: {
                "title": title,
                "points": thin([[int(r["step"]), r[key]] for r in rows if r.get(key) is not None]),
            }
            for key, title in CURVES.items()
        }
        tensorboard = None if self.output_dir is None else self.output_dir / "tensorboard"
        return {
            "steps": len(rows),
            "curves": curves,
            "output_dir": None if self.output_dir is None else str(self.output_dir),
            "tensorboard": str(tensorboard) if tensorboard and tensorboard.is_dir() else None,
            "demo": self.demo() if self.demo is not None else None,
        }

    def memory(self) -> dict[str, Any]:
        """The preference memory's entries: ``active`` (oldest first), ``ended`` (replaced,
        evicted, retired, turned off; newest first; forgotten ones are left out) and ``counts``
        by status; an entry that training distilled has ``gap`` (mean teacher-student gap of its
        last distilled turns, nats per token: retired at ``memory.retire_gap``) and
        ``distilled`` (how many turns that mean is over); ``enabled`` when this server adds them to prompts (``None``: unknown, a
        dashboard over a store)."""
        return dict(self.cached("memory", self._memory))

    def _memory(self) -> dict[str, Any]:
        entries = self.store.memory_entries(None, active_only=False)
        rows = [
            {"id": e.id, "user_id": e.user_id, "text": e.text, "status": str(e.status),
             "source": str(e.source), "source_turn_id": e.source_turn_id,
             "source_session_id": e.source_session_id, "support": e.support,
             "updated_at": e.updated_at, "end_reason": e.end_reason, **_distilled(e.history)}
            for e in entries
            if e.status != "forgotten"
        ]  # fmt: skip
        return {
            "enabled": self.memory_enabled,
            "active": [r for r in rows if r["status"] == "active"],
            "ended": sorted(
                (r for r in rows if r["status"] != "active"), key=lambda r: -r["updated_at"]
            ),
            "counts": dict(Counter(str(e.status) for e in entries)),
        }

    def judge(self) -> dict[str, Any]:
        """Score distribution, abstentions by reason (the judgment's and each vote's), turns
        never sent to the judge, hint rate, latency and, where the scenario knows the truth,
        the agreement with it."""
        return dict(self.cached("judge", self._judge))

    def _judge(self) -> dict[str, Any]:
        counts = self.store.judgment_counts()
        recent = self.store.recent_judgments(500)
        votes: Counter[str] = Counter()
        vote_total = 0
        for j in recent:
            for v in j.votes:
                vote_total += 1
                if v.get("abstain"):
                    votes[str(v["abstain"])] += 1
        # the worker's rows for turns nothing came after are bookkeeping, not verdicts
        real = [j for j in recent if not j.skipped]
        latencies = sorted(j.latency_s for j in real if j.latency_s is not None)
        judged = _scored(counts)
        return {
            "judged": judged,
            "distribution": {k: counts[k] for k in ("+1", "-1", "0") if k in counts},
            "no_judgment": {
                k.split("/", 1)[1]: v for k, v in counts.items() if k.startswith("none/")
            },
            "skipped": {
                k.split("/", 1)[1]: v for k, v in counts.items() if k.startswith("skipped/")
            },
            "hinted": counts.get("hinted", 0),
            "vote_abstentions": dict(votes.most_common()),
            "votes_seen": vote_total,
            "latency_p50_s": latencies[len(latencies) // 2] if latencies else None,
            "backends": sorted({j.backend for j in real}),
            "agreement": self.agreement() if self.agreement is not None else None,
            "recent": [
                {
                    "turn_id": j.turn_id,
                    "session_id": j.session_id,
                    "score": j.score,
                    "reason": j.reason,
                    "hint": j.hint,
                    "backend": j.backend,
                    "created_at": j.created_at,
                }
                for j in real[:20]
            ],
        }


def demo_view(result: Any) -> dict[str, Any]:
    """The demo's part of the dashboard from a :class:`clawrl.demo.runner.MethodResult` (live
    or loaded from ``results.json``): per evaluated step the score with its 95 % interval, each
    check's pass rate with its bootstrap interval over the held-out problems, and the two
    held-out answers that improved most, before and after."""
    from clawrl.stats import bootstrap_ci

    def get(obj: Any, key: str, default: Any = None) -> Any:
        return obj.get(key, default) if isinstance(obj, dict) else getattr(obj, key, default)

    evaluations = sorted((get(result, "evaluations") or {}).items(), key=lambda kv: int(kv[0]))
    seed = int(get(result, "seed") or 0)
    steps = []
    for step, ev in evaluations:
        per_item = get(ev, "checks") or []
        checks = {}
        for name, rate in (get(ev, "check_rates") or {}).items():
            flags = [1.0 if item.get(name) else 0.0 for item in per_item if name in item]
            ci = list(bootstrap_ci(flags, seed=seed)) if flags else []
            checks[name] = {"rate": rate, "ci": ci}
        steps.append({
            "step": int(step), "version": get(ev, "version"), "score": get(ev, "score"),
            "ci": list(get(ev, "ci") or []), "checks": checks,
        })  # fmt: skip
    examples = []
    questions = list(get(result, "questions") or [])
    if len(evaluations) >= 2:
        first, last = evaluations[0][1], evaluations[-1][1]
        before, after = get(first, "answers") or [], get(last, "answers") or []
        sb, sa = get(first, "scores") or [], get(last, "scores") or []
        order = sorted(range(min(len(sb), len(sa))), key=lambda i: sa[i] - sb[i], reverse=True)
        for i in order[:2]:
            if i < len(questions) and i < len(before) and i < len(after):
                examples.append({
                    "question": questions[i], "before": _cut(before[i], 1500),
                    "after": _cut(after[i], 1500), "score_before": sb[i], "score_after": sa[i],
                })  # fmt: skip
    return {
        "method": get(result, "method"),
        "seed": seed,
        "evaluations": steps,
        "examples": examples,
    }


def load_demo_result(results_json: Path, run: str | None = None) -> dict[str, Any] | None:
    """One run of a demo's ``results.json`` (``METHOD-seedN``; default: the first).

    Raises:
        StoreError: no such run in the file.
    """
    data = json.loads(results_json.read_text(encoding="utf-8"))
    if not data:
        return None
    if run is None:
        return data[0]
    for r in data:
        if f"{r.get('method')}-seed{r.get('seed')}" == run:
            return r
    raise StoreError(f"{results_json} has no run {run!r}")


def _distilled(history: list[dict[str, Any]]) -> dict[str, Any]:
    """An entry's last distillation gap (:meth:`clawrl.memory.MemoryKeeper.record_distillation`):
    ``{"gap": mean or None, "distilled": turns}``."""
    event = next((h for h in history if h.get("event") == "distilled"), None)
    if event is None:
        return {"gap": None, "distilled": 0}
    return {"gap": event.get("mean_gap"), "distilled": len(event.get("gaps") or [])}
