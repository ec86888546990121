"""``clawrl serve``: the OpenAI-compatible gateway on the embedded engine, recording every call."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from clawrl.cli.common import (
    STORE_HELP,
    add_config_options,
    add_model_options,
    quiet_transformers,
    with_model_flags,
)
from clawrl.cli.options import add_engine_options, add_online_options, config_with_flags
from clawrl.errors import ConfigError

if TYPE_CHECKING:
    from clawrl.store import PolicyVersionRecord, TurnRecord

API_KEY_ENV = "CLAWRL_API_KEY"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "serve",
        help="serve the policy behind OpenAI- and Anthropic-compatible APIs; record every call",
        description="Start the clawrl gateway: POST /v1/chat/completions (streaming, tools, n, "
        "logprobs), POST /v1/messages (Anthropic Messages, for Claude Code), POST /v1/responses "
        "(OpenAI Responses, for Codex), GET /v1/models, /healthz, /metrics, POST /v1/feedback and "
        "/v1/sessions/{id}/end, and the live dashboard at /dashboard (sessions, judgments, "
        "training). Every call is recorded token-exactly in the store and printed as one "
        "console line (--quiet: none). Binding an "
        f"address other than loopback needs an API key (--api-key or ${API_KEY_ENV}).",
        epilog="examples:\n"
        "  clawrl serve --model smollm2-135m --port 8000 --store clawrl.db\n"
        "  clawrl serve --engine vllm --method combine        # clawrl launches a vLLM server\n"
        "  clawrl serve --method combine --external-trainer   # + judge worker, clawrl train\n"
        "  clawrl serve --vllm-url http://gpu1:8000 --vllm-url http://gpu2:8000 --method rl\n"
        "  clawrl serve --memory --store clawrl.db            # + what users asked for before",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_options(p)
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="TCP port (default 8000; 0 picks a free one)")
    p.add_argument("--store", help=STORE_HELP.replace("server.store, ", ""))
    p.add_argument("--api-key", help=f"require this bearer key (or set ${API_KEY_ENV}); with "
                   "--user-keys it is the admin key, which sees every user's data")  # fmt: skip
    p.add_argument("--user-keys", metavar="FILE",
                   help="users' API keys, one 'USER KEY' per line: a request with one is that "
                   "user's, and sees only that user's sessions and feedback "
                   "(server.user_keys_file)")  # fmt: skip
    p.add_argument("--served-model-name", help="name in /v1/models (default: the model spec)")
    p.add_argument(
        "--shutdown-grace",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="on Ctrl-C/SIGTERM, let requests in flight finish for this long, then end them "
        "with a 503 in their API's error shape (10)",
    )
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no console line per request (by default each recorded call prints one: time, "
        "API, session, turn, prompt+completion tokens, latency, policy version, status)",
    )
    p.add_argument(
        "--memory",
        action="store_true",
        default=None,
        help="preference memory: keep the directives of judges' hints and feedback comments "
        "(POST /v1/feedback with a comment) as short entries and add them to the system message "
        "of every main call, so what a user asked for in one session shapes the next "
        "(memory.enabled; see them with clawrl memory list)",
    )
    p.add_argument(
        "--per-user-adapters",
        action="store_true",
        default=None,
        help="serve each user (the x-clawrl-user header or the body's user field; "
        "server.user_from) with the newest version of their own LoRA adapter on top of the "
        "policy, many users batched together; with a training method each user's judged turns "
        "train their own adapter (the shared policy is not trained then; turns naming no user "
        "are not trained); record one by hand with clawrl users adapter USER DIR "
        "(server.per_user_adapters)",
    )
    p.add_argument(
        "--distill",
        action="store_true",
        default=None,
        help="with --memory and --method opd or combine: train each turn that had memory "
        "without it (context distillation: the policy with the memory is the teacher) and "
        "retire an entry once the weights alone follow it (memory.distill, memory.retire_gap); "
        "its turns are off-policy: add --ratio tis --opd-clip 2 (what clawrl demo "
        "--memory runs)",
    )
    add_engine_options(p)
    add_online_options(p)
    add_config_options(p)
    p.set_defaults(func=run)


PROTOCOL_NAMES = {
    "openai.chat": "chat",
    "anthropic.messages": "messages",
    "openai.responses": "responses",
}


def _printable(text: str) -> str:
    """``text`` with control, bidi and other unprintable characters as ``\\uXXXX`` escapes, so
    that a client's id cannot rewrite the console line."""
    return "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text)


def _short_id(session_id: str, most: int = 24) -> str:
    """A session id whole when it is short (a name a client chose), else its first 12 chars."""
    return session_id if len(session_id) <= most else session_id[:12] + "…"


def request_line(turns: list[TurnRecord]) -> str:
    """One console line for a request's recorded turns (one per choice), e.g.
    ``19:04:11 chat session 3f2a1b2c turn 9e8d7c6b 412+37 tokens 1.84 s v3 ok stop`` (``412+37
    tokens +memory 2`` when the preference memory added two entries to the prompt; ``user
    alice`` after the session when the request named a user)."""
    first = turns[0]
    when = time.strftime("%H:%M:%S", time.localtime(first.created_at))
    api = PROTOCOL_NAMES.get(first.protocol.value, first.protocol.value)
    kind = f" side/{first.side_kind}" if first.side_kind else ""
    completion = sum(len(t.completion_ids) for t in turns)
    latency = max((t.latency_s or 0.0) for t in turns)
    choices = f" x{len(turns)}" if len(turns) > 1 else ""
    memory = f" +memory {len(first.memory['entries'])}" if first.memory else ""
    user = f" user {_printable(_short_id(first.user_id))}" if first.user_id else ""
    if first.adapter_version is not None:
        user += f" adapter v{first.adapter_version}"
    statuses = ",".join(sorted({t.status.value for t in turns}))
    finish = ",".join(sorted({t.finish_reason or "-" for t in turns}))
    untrainable = sorted({t.untrainable_reason for t in turns if t.untrainable_reason})
    why = f" ({_printable(','.join(untrainable))})" if untrainable else ""
    return (
        f"{when} {api}{_printable(kind)} session {_printable(_short_id(first.session_id))}"
        f"{user} turn {first.id[:8]}{choices} "
        f"{len(first.prompt_ids)}+{completion} tokens{memory} {latency:.2f} s "
        f"v{first.policy_version} {statuses} {finish}{why}"
    )


def error_line(method: str, path: str, status: int, message: str) -> str:
    """One console line for a request answered with an error and no recorded turn, e.g.
    ``19:04:11 POST /v1/chat/completions 400: messages[0].role: ...``."""
    when = time.strftime("%H:%M:%S")
    text = _printable(" ".join(message.split()))
    return f"{when} {method} {_printable(path)} {status}: {text[:300]}"


def version_line(record: PolicyVersionRecord) -> str:
    """One console line when the gateway starts serving a version another process published."""
    when = time.strftime("%H:%M:%S")
    return f"{when} serving policy v{record.version} (published at step {record.step})"


def resolve_api_key(flag: str | None, configured: str | None) -> str | None:
    """The API key: ``--api-key``, else ``$CLAWRL_API_KEY``, else the config's (empty = none)."""
    for value in (flag, os.environ.get(API_KEY_ENV), configured):
        if value is not None and value.strip():
            return value.strip()
    return None


def check_bind(host: str, api_key: str | None) -> None:
    """Refuse to expose the gateway beyond this machine without an API key.

    Raises:
        ConfigError: ``host`` is not a loopback address and no key is set.
    """
    from clawrl.gateway.auth import is_loopback

    if not is_loopback(host) and api_key is None:
        raise ConfigError(
            f"refusing to bind {host!r} without an API key: anyone who can reach it could use "
            f"the policy and write to the trajectory store. Pass --api-key KEY (or set "
            f"{API_KEY_ENV}), or bind 127.0.0.1."
        )


def _server(config: object, on_exit: Callable[[], None], grace_s: float) -> object:
    """A uvicorn server that stops on SIGINT/SIGTERM without re-raising the signal afterwards
    (uvicorn's default), so ``clawrl serve`` closes the engine and the store and exits 0.

    Requests in flight get ``grace_s`` seconds to finish; then ``on_exit`` runs (it closes the
    engine), so each remaining request ends with the gateway's 503 ``unavailable`` error in
    its protocol's shape (an error event for a stream) and its turn is recorded as incomplete,
    instead of uvicorn cancelling it with a plain-text 500 after its own graceful timeout.
    """
    import uvicorn

    class Server(uvicorn.Server):
        _timer: threading.Timer | None = None

        def handle_exit(self, sig: int, frame: object) -> None:
            super().handle_exit(sig, frame)  # type: ignore[arg-type]
            if self._timer is None:
                self._timer = threading.Timer(grace_s, on_exit)
                self._timer.daemon = True
                self._timer.start()

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            handled = (signal.SIGINT, signal.SIGTERM)
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server(config)  # type: ignore[arg-type]


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::"):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host


def run(args: argparse.Namespace) -> int:
    cfg = config_with_flags(args)
    cfg = with_model_flags(cfg, args)
    overrides: dict[str, object] = {}
    if args.store:
        overrides["server"] = cfg.server.model_copy(update={"store": args.store})
    cfg = cfg.model_copy(update=overrides)
    host = args.host or cfg.server.host
    port = cfg.server.port if args.port is None else args.port
    api_key = resolve_api_key(args.api_key, cfg.server.api_key)
    user_keys = None
    keys_file = args.user_keys or cfg.server.user_keys_file
    if keys_file:
        from clawrl.gateway.auth import load_user_keys

        user_keys = load_user_keys(keys_file, admin_key=api_key)
        if cfg.memory.enabled:
            raise ConfigError(
                "--memory keeps one memory for the served policy: every user's directives would "
                "reach every other user's prompts, which users' keys promise not to do; serve "
                "without --memory (or without --user-keys)"
            )
    check_bind(host, api_key or (next(iter(user_keys)) if user_keys else None))
    from clawrl.gateway.server import bind_socket

    sock = bind_socket(host, port)

    quiet_transformers()
    import uvicorn
    from rich.console import Console

    from clawrl.runtime import build_runtime

    err = Console(stderr=True)
    spec, method = cfg.model.spec, cfg.trainer.method
    in_process = method.trains and not cfg.server.external_trainer
    loading = f"loading {spec}" + (" and the judge" if in_process else "")
    if cfg.engine.backend == "vllm" and not cfg.engine.vllm_urls:
        log_path = Path(cfg.trainer.output_dir) / "vllm" / "vllm-server.log"
        print(f"launching a vLLM server for {spec} (1-3 min on a CPU; its log: {log_path})",
              flush=True)  # fmt: skip
        loading += " and launching vLLM"

    def terminate(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)  # unwinds build_runtime: a launched server is stopped

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        with err.status(loading):
            runtime = build_runtime(cfg, model_name=args.served_model_name, api_key=api_key,
                                    user_keys=user_keys)  # fmt: skip
    finally:
        signal.signal(signal.SIGTERM, previous)
    try:
        name = runtime.model_name
        if runtime.service is not None:
            service = runtime.service
            previous = signal.signal(signal.SIGTERM, terminate)  # unwinds to runtime.close()
            try:
                with err.status("resuming from the latest checkpoint"):
                    version = runtime.resume()
            finally:
                signal.signal(signal.SIGTERM, previous)
            service.on_step(lambda m: print(service.step_line(m), flush=True))
            judge = runtime.judge.description if runtime.judge is not None else ""
            print(
                f"clawrl online loop: method={method.kind} batch={cfg.trainer.batch_size}"
                f" judge={judge} policy version {version} (output: {cfg.trainer.output_dir})",
                flush=True,
            )
        if runtime.follower is not None:
            runtime.follower.listeners.append(lambda r: print(version_line(r), flush=True))
            if method.trains:
                print(
                    f"clawrl gateway: method={method.kind} trained by its own processes (clawrl "
                    f"judge worker, clawrl train) on this store; serving each version they "
                    f"publish (checked every {cfg.server.version_poll_s:g} s)",
                    flush=True,
                )
        bound = sock.getsockname()[1]
        base = f"http://{_url_host(host)}:{bound}/v1"
        auth = ' -H "Authorization: Bearer $CLAWRL_API_KEY"' if api_key or user_keys else ""
        print(f"clawrl gateway: serving {name} at {base}  (store: {runtime.store.target})",
              flush=True)  # fmt: skip
        if user_keys:
            admin = "the --api-key key sees every user" if api_key else (
                "no admin key (--api-key): nobody sees every user's data over HTTP")  # fmt: skip
            print(f"users' keys: {len(user_keys)} users from {keys_file}, each sees their own "
                  f"data only (read at start: restart to change them); {admin}", flush=True)  # fmt: skip
        shared = runtime.store.latest_policy_version()
        if cfg.server.per_user_adapters and runtime.service is not None and shared is not None:
            print(f"per-user adapters train on the base weights: this store's shared policy "
                  f"v{shared.version} is not served (serve without --per-user-adapters to "
                  "serve it)", flush=True)  # fmt: skip
        if cfg.server.per_user_adapters:
            sources = "their keys" if user_keys else (", ".join(cfg.server.user_from) or "nowhere")
            print(f"per-user adapters: on (users from {sources}"
                  f"; at most {cfg.engine.max_adapters} in memory; record one with clawrl users "
                  "adapter USER DIR)", flush=True)  # fmt: skip
        if not args.quiet:
            runtime.app.state.gateway.turn_listeners.append(
                lambda turns: print(request_line(turns), flush=True)
            )
            runtime.app.state.gateway.error_listeners.append(
                lambda *error: print(error_line(*error), flush=True)
            )
            if cfg.memory.enabled:  # a line per memory change (clawrl.memory's log)
                logging.getLogger("clawrl.memory").setLevel(logging.INFO)
                n = len(runtime.store.memory_entries())
                distill = (
                    f", distilled into the weights (entries retire at a gap <= "
                    f"{cfg.memory.retire_gap} over {cfg.memory.retire_turns} turns)"
                    if cfg.memory.distill else ""
                )  # fmt: skip
                print(f"clawrl memory: on, {n} active entries{distill} (clawrl memory list; "
                      f"the dashboard's Memory page)", flush=True)  # fmt: skip
        print(
            f"  curl -N {base}/chat/completions{auth} -H 'Content-Type: application/json' \\\n"
            f'    -d \'{{"model": "{name}", "stream": true, '
            f'"messages": [{{"role": "user", "content": "Hi"}}]}}\'',
            flush=True,
        )
        dash = f"http://{_url_host(host)}:{bound}/dashboard"
        print(
            f"clawrl dashboard: {dash}"
            + ("  (log in with any user name and the API key as password)" if api_key else ""),
            flush=True,
        )
        grace = max(0.0, float(args.shutdown_grace))
        config = uvicorn.Config(
            runtime.app, log_level="warning", lifespan=runtime.lifespan,
            timeout_graceful_shutdown=int(grace) + 30,  # after the engine has ended the rest
        )  # fmt: skip
        server = _server(config, runtime.engine.close, grace)
        try:
            server.run(sockets=[sock])  # type: ignore[attr-defined]
        finally:
            timer = getattr(server, "_timer", None)
            if timer is not None:  # everything finished within the grace period
                timer.cancel()
    finally:
        runtime.close()
        sock.close()
        print("clawrl gateway: stopped (engine and store closed)", file=sys.stderr, flush=True)
    return 0
