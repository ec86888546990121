"""The composition root: engine, store, judge, online learner and gateway app from one config.

``clawrl serve``, ``clawrl demo`` and harness mode build what they run here, and nowhere else::

    runtime = build_runtime(load_config(...))          # policy, engine, store, app (+ online loop)
    runtime.resume()                                    # the latest checkpoint, if any
    with runtime.serve() as server:                     # a live gateway on 127.0.0.1:PORT
        ...
    runtime.close()                                     # engines and store

What is built, from :class:`clawrl.config.Config`:

* the policy (``model``), its engine (``engine.backend``: the in-process transformers engine);
* the trajectory store (``server.store``, or the one passed in);
* with a training method (``trainer.method`` other than ``off``) and ``online=True``: the judge
  (``judge``; a local backend gets its own engine over a separate copy of the judge model, so
  training never changes the judge) and the online loop (:class:`~clawrl.trainer.service.
  OnlineService`: judge worker + learner), run by the app's lifespan; with ``online=False``
  (harness mode): a :class:`~clawrl.trainer.Trainer` the caller steps itself, and with a method
  whose samples carry step scores (``prm_outcome``) the judge that scores each turn;
* without training, or with ``server.external_trainer`` (the judge and the trainer run as their
  own processes): a :class:`~clawrl.gateway.versions.VersionFollower` in the app's lifespan, so
  the gateway serves each policy version the trainer (``clawrl train``, or another replica)
  published in the store;
* the gateway app (:func:`clawrl.gateway.create_app`) over all of it, with the live dashboard
  (:mod:`clawrl.dashboard`) mounted at ``/dashboard``.

The runtime owns what it built (engines, store) and closes it; what the caller passed in
(a policy, a store, a judge) stays the caller's.

The separate processes are built here too: :func:`build_judge_worker` (``clawrl judge worker``)
and :func:`build_trainer_process` (``clawrl train``, one rank of it under torchrun), and harness
mode's warm-start gateway over scripted replies, :func:`build_replay_gateway`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from clawrl.config import Config
from clawrl.engine import Engine
from clawrl.engine.threads import call_in_transient_thread
from clawrl.errors import ConfigError
from clawrl.judge.worker import JudgeFn
from clawrl.store import Store

if TYPE_CHECKING:
    from fastapi import FastAPI

    from clawrl.dashboard import DashboardSource
    from clawrl.engine.scripted import ScriptedEngine
    from clawrl.gateway.server import LiveServer
    from clawrl.gateway.versions import VersionFollower
    from clawrl.judge import Judge
    from clawrl.judge.worker import JudgeWorker
    from clawrl.models import Policy
    from clawrl.trainer import Trainer
    from clawrl.trainer.distributed import DistEnv
    from clawrl.trainer.learner import Learner
    from clawrl.trainer.process import TrainerProcess
    from clawrl.trainer.service import OnlineService

ENGINE_BACKENDS: dict[str, Callable[[Any, Config], Engine]] = {}
"""``engine.backend`` -> a factory ``(policy, config) -> Engine``."""


def _transformers_engine(policy: Policy, config: Config) -> Engine:
    from clawrl.engine import TransformersEngine

    kwargs: dict[str, Any] = {
        "max_batch": config.engine.max_batch,
        "max_adapters": config.engine.max_adapters,
    }
    if config.engine.max_context is not None:
        kwargs["max_context"] = config.engine.max_context
    return TransformersEngine.from_policy(policy, **kwargs)


def _vllm_engine(policy: Policy, config: Config) -> Engine:
    """vLLM servers: those in ``engine.vllm_urls``, or one launched here over the policy's
    model directory (stopped when the engine closes)."""
    from clawrl.engine.vllm import VLLMEngine, VLLMServer

    ec = config.engine
    urls = list(ec.vllm_urls)
    on_close = None
    if not urls:
        if policy.path is None:
            raise ConfigError("launching vLLM needs a model directory (engine.vllm_urls is empty)")
        server = VLLMServer(
            policy.path, python=ec.vllm_python, run_dir=Path(config.trainer.output_dir) / "vllm",
            dtype=config.model.dtype, max_lora_rank=config.trainer.lora_rank,
            # per-user adapters: the base's zero adapter, the policy's and the users' at once
            # slots in one batch stay few (vLLM reserves memory for each); the rest wait on CPU
            max_loras=min(ec.max_adapters + 2, 8) if config.server.per_user_adapters else 4,
            max_cpu_loras=ec.max_adapters + 2 if config.server.per_user_adapters else None,
            extra_args=ec.vllm_args, startup_timeout_s=ec.vllm_startup_timeout_s,
        )  # fmt: skip
        urls, on_close = [server.start()], server.stop
        server.supervise()  # restarted when it dies; the engine resyncs it before it serves
    try:
        from clawrl.engine.inputs import policy_eos_ids

        return VLLMEngine(
            urls, policy.tokenizer, eos_token_ids=policy_eos_ids(policy),
            max_context=ec.max_context, api_key=ec.vllm_api_key,
            scoring_defer_s=ec.scoring_defer_s, scoring_slots=ec.scoring_slots,
            publish_dir=Path(config.trainer.output_dir) / "vllm-weights", on_close=on_close,
        )  # fmt: skip
    except BaseException:
        if on_close is not None:
            on_close()
        raise


ENGINE_BACKENDS["transformers"] = _transformers_engine
ENGINE_BACKENDS["vllm"] = _vllm_engine


def _serve_base_through_zero_adapter(engine: Engine, trainer: Trainer, config: Config) -> None:
    """A vLLM engine serves the base weights through a zero copy of the trainer's LoRA adapter
    from the first request on (:mod:`clawrl.engine.vllm.engine` says which vLLM behaviour this
    avoids); nothing for other engines or full fine-tuning."""
    if not engine.needs_base_adapter or config.trainer.full_finetune:
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="clawrl-adapter-") as tmp:
        trainer.model.save_pretrained(tmp)  # type: ignore[operator]
        engine.use_base_adapter(tmp)


def build_engine(policy: Policy, config: Config) -> Engine:
    """The serving engine ``config.engine.backend`` names, over ``policy``."""
    return ENGINE_BACKENDS[config.engine.backend](policy, config)


@dataclass
class JudgeBundle:
    """A judge and the engine it owns.

    Attributes:
        judge: ``async (JudgeInput) -> Judgment``.
        engine: the judge's own local engine (``None`` for an endpoint judge, the head judge
            or a test judge); closed by :meth:`close`.
        description: ``backend xm`` for console lines.
        prm: the :class:`clawrl.judge.Judge` behind ``judge`` (``None`` for a test judge).
    """

    judge: JudgeFn
    engine: Engine | None = None
    description: str = ""
    prm: Judge | None = None

    def close(self) -> None:
        """Close the judge's engine, if it has one."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None


def load_model(config: Config) -> Policy:
    """The policy ``config.model`` describes (its chat template and stop ids applied).

    Raises:
        ModelLoadError: the model, its template or a stop id cannot be loaded.
    """
    from clawrl.models import load_policy

    mc = config.model
    return load_policy(
        mc.spec, dtype=mc.dtype, device=mc.device, chat_template=mc.chat_template,
        stop_ids=mc.stop_ids,
    )  # fmt: skip


def judge_model_spec(config: Config) -> str:
    """The model a local judge reads: ``judge.model`` when set; else, for the head backend, the
    model its head set was trained on (the shipped head's is the embedded SmolLM2-135M, whatever
    the policy is: the head reads only the next state's text, so it judges any policy's turns);
    else (choice, generative) the policy's base weights, ``model.spec``."""
    from clawrl.config.judge import HeadJudgeConfig

    jc = config.judge
    if jc.model:
        return jc.model
    if isinstance(jc.backend, HeadJudgeConfig):
        from clawrl.judge.head import default_head_path, head_model_spec

        return head_model_spec(jc.backend.path or default_head_path())
    return config.model.spec


def build_judge(config: Config) -> JudgeBundle:
    """The PRM judge of ``config.judge``.

    A local backend runs over a separate copy of the judge model (:func:`judge_model_spec`:
    the head's own model for the head backend, the policy's base weights for choice and
    generative, unless ``judge.model`` names one); choice and generative get their own engine;
    an ``openai`` backend talks to its endpoint.

    Raises:
        JudgeError: a backend that cannot be built (no API key, ...).
        ModelError: the judge model cannot be loaded.
    """
    from clawrl.config.judge import HeadJudgeConfig, OpenAIJudgeConfig
    from clawrl.judge import Judge
    from clawrl.judge.backends import build_backend
    from clawrl.models import load_policy

    jc = config.judge
    engine: Engine | None = None
    tokenizer = judge_model = None
    name = ""
    if not isinstance(jc.backend, OpenAIJudgeConfig):
        spec = judge_model_spec(config)
        judge_policy = (  # the policy's own base weights: with its chat template and stop ids
            load_model(config) if spec == config.model.spec
            else load_policy(spec, dtype=config.model.dtype, device=config.model.device)
        )  # fmt: skip
        tokenizer, name, judge_model = judge_policy.tokenizer, spec, judge_policy.model
        if not isinstance(jc.backend, HeadJudgeConfig):  # the head reads the model itself
            # the judge reads whole turns plus their next state: its own model's window, not
            # the policy's engine.max_context
            # in-process unless judge.vllm_urls names servers of the judge model
            own_window = config.engine.model_copy(update={
                "max_context": None, "vllm_urls": list(jc.vllm_urls),
                "backend": "vllm" if jc.vllm_urls else "transformers",
            })  # fmt: skip
            engine = build_engine(judge_policy, config.model_copy(update={"engine": own_window}))
    try:
        backend = build_backend(
            jc.backend, engine=engine, tokenizer=tokenizer, model=name, judge_model=judge_model
        )
    except BaseException:
        if engine is not None:
            engine.close()
        raise
    judge = Judge(backend, votes=jc.votes, timeout_s=jc.timeout_s, hint_quorum=jc.hint_quorum)
    return JudgeBundle(judge.judge, engine, f"{jc.backend.kind} x{jc.votes}", judge)


@dataclass
class Runtime:
    """Everything one gateway process runs, built by :func:`build_runtime`.

    Attributes:
        config: what it was built from.
        policy: the loaded policy (tokenizer, base weights).
        engine: the serving engine.
        store: the trajectory store.
        app: the gateway ASGI app (its lifespan runs the online loop when there is one).
        model_name: the served model name.
        service: the online loop (judge worker + learner), or ``None``.
        trainer: harness mode's trainer (``online=False`` with a training method), or ``None``.
        learner: harness mode's one learner over ``trainer`` (:class:`clawrl.trainer.learner.
            Learner`: checkpoints, ``samples`` rows, ``policy_versions``, publishing to
            ``engine``), or ``None``.
        judge: the judge the online loop uses, or harness mode's with a method that scores
            steps (``prm_outcome``), or ``None``.
        dashboard: what ``/dashboard`` reads (the demo sets its ``demo`` view).
        follows_versions: the app's lifespan loads the policy versions another process
            publishes in the store (a replica that does not train: ``clawrl.gateway.versions``).
        follower: that :class:`~clawrl.gateway.versions.VersionFollower`, or ``None``.
    """

    config: Config
    policy: Policy
    engine: Engine
    store: Store
    app: FastAPI
    model_name: str
    service: OnlineService | None = None
    trainer: Trainer | None = None
    learner: Learner | None = None
    judge: JudgeBundle | None = None
    dashboard: DashboardSource | None = None
    follows_versions: bool = False
    follower: VersionFollower | None = None
    _owned: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def resume(self) -> int:
        """Restore the online loop's latest checkpoint (if any): the policy version served."""
        if self.service is None:
            return self.engine.policy_version
        # a thread that ends with it, like the rest of the torch work (clawrl.engine.threads)
        return call_in_transient_thread(self.service.resume, name="clawrl-resume")

    def serve(self, host: str = "127.0.0.1", port: int = 0) -> LiveServer:
        """A started :class:`clawrl.gateway.server.LiveServer` for the app (online loop on)."""
        from clawrl.gateway.server import LiveServer

        return LiveServer(self.app, host=host, port=port, lifespan=self.lifespan).start()

    @property
    def lifespan(self) -> Literal["on", "off"]:
        """uvicorn's ``lifespan`` setting for the app: ``"on"`` when it runs the online loop
        or follows published versions (``clawrl.gateway.versions``)."""
        return "on" if self.service is not None or self.follows_versions else "off"

    def close(self) -> None:
        """Close what the runtime built (engines, store), last built first; idempotent."""
        while self._owned:
            closer = self._owned.pop()
            with contextlib.suppress(Exception):
                closer()


def build_runtime(
    config: Config,
    *,
    policy: Policy | None = None,
    store: Store | str | Path | None = None,
    judge: JudgeBundle | None = None,
    model_name: str | None = None,
    api_key: str | None = None,
    user_keys: dict[str, str] | None = None,
    online: bool = True,
    schedule: Literal["async", "fixed"] = "async",
) -> Runtime:
    """Build a :class:`Runtime` from ``config`` (see the module docstring).

    Args:
        config: all settings.
        policy: an already loaded policy (tests, the demo); default: ``config.model``.
        store: a store, or its path; default ``config.server.store``. A store passed in is not
            closed by the runtime.
        judge: the judge to use (the demo shares one between methods); default: built from
            ``config.judge`` when the online loop or a ``prm_outcome`` harness run needs one,
            and then owned by the runtime.
        model_name: the served name; default: the model spec (a directory's name).
        api_key: the bearer key every route but ``/healthz`` requires (``None``: no auth).
        user_keys: users' keys, key -> user (:func:`clawrl.gateway.auth.load_user_keys`).
        online: with a training method, run the online loop (True) or give the caller a
            trainer to step (False, harness mode). With ``server.external_trainer`` the online
            loop runs elsewhere (``clawrl judge worker`` and ``clawrl train``) and this app
            follows the versions they publish.
        schedule: when the online loop steps (:mod:`clawrl.trainer.service`): ``async``
            (serving: whenever a batch is ready) or ``fixed`` (the demo: only when the caller
            calls ``runtime.service.settle``, samples in a fixed order).

    Raises:
        ConfigError: the method does not fit the mode (``grpo`` and ``prm_outcome`` need
            harness rollout groups; harness mode trains only those), an external trainer
            without version polling (``server.version_poll_s`` 0), or a part's settings are
            wrong.
        ModelError, JudgeError, StoreError: a part cannot be built (whatever was built before
            it is closed).
    """
    from clawrl.dashboard import DashboardSource, mount_dashboard
    from clawrl.gateway import create_app

    spec = config.model.spec
    method = config.trainer.method
    if method.trains and method.needs.group == online:
        raise ConfigError(
            f"method {method.kind!r} "
            + ("needs rollout groups: use it in harness mode (clawrl harness train)"
               if online else "cannot train harness rollouts: use grpo, dr_grpo or prm_outcome")
        )  # fmt: skip
    external = config.server.external_trainer and online
    if external and config.server.version_poll_s <= 0:
        raise ConfigError(
            "server.external_trainer needs server.version_poll_s > 0: an external trainer's "
            "versions reach this gateway only through the store"
        )
    if config.memory.distill and external:
        raise ConfigError(
            "with server.external_trainer the trainer process distils the memory: give it "
            "there (clawrl train --method combine --distill) and serve with --memory alone "
            "(--set memory.distill=false here when a shared config file sets it)"
        )
    if config.memory.distill and not (method.trains and online):
        raise ConfigError(
            "memory.distill trains the served policy's memory turns: it needs an online "
            "method that trains (opd or combine; not off or a harness method), here or in "
            "clawrl train --distill"
        )
    if config.memory.distill and not method.needs.uses_hint:
        raise ConfigError(f"memory.distill needs a method with a teacher (opd or combine), not "
                          f"{method.kind!r}")  # fmt: skip
    if config.memory.distill and not config.memory.enabled:
        raise ConfigError("memory.distill trains the turns this server gives its memory: turn "
                          "the memory on too (clawrl serve --memory --distill, or "
                          "memory.enabled = true)")  # fmt: skip
    owned: list[Callable[[], None]] = []
    try:
        if not isinstance(store, Store):  # first: a bad store URL fails before the model loads
            store = Store(store if store is not None else config.server.store)
            owned.append(store.close)
        from clawrl.memory import MemoryKeeper

        keeper = MemoryKeeper(
            store, max_entries=config.memory.max_entries, sync_s=config.memory.sync_s,
            retire_gap=config.memory.retire_gap, retire_turns=config.memory.retire_turns,
        )  # fmt: skip
        # torch work (loading, building the trainer and the judge) runs in threads that end
        # with it: the main thread would keep an OpenMP team that slows the engine's thread
        # as long as the server runs (clawrl.engine.threads)
        if policy is None:
            policy = call_in_transient_thread(load_model, config, name="clawrl-load")
        engine = build_engine(policy, config)
        owned.append(engine.close)
        service: OnlineService | None = None
        trainer: Trainer | None = None
        harness_learner: Learner | None = None
        if method.trains and online and not external:
            from clawrl.trainer.metrics import MetricsWriter
            from clawrl.trainer.service import OnlineService

            if judge is None:
                judge = call_in_transient_thread(build_judge, config, name="clawrl-load")
                owned.append(judge.close)
            judged_by = judge.judge
            metrics = MetricsWriter.from_config(config.trainer.output_dir, config)
            owned.append(metrics.close)
            service = call_in_transient_thread(lambda: OnlineService(
                store, engine, policy, judged_by, config.trainer,
                judge_timeout_s=config.judge.timeout_s, schedule=schedule, metrics=metrics,
                memory=keeper if config.memory.distill else None,
                per_user=config.server.per_user_adapters, max_users=config.engine.max_adapters,
            ), name="clawrl-load")  # fmt: skip
        elif method.trains and not online:  # harness mode: the caller steps this learner
            from clawrl.trainer import Trainer
            from clawrl.trainer.learner import Learner
            from clawrl.trainer.metrics import MetricsWriter

            start = engine.policy_version
            trainer = call_in_transient_thread(
                lambda: Trainer(policy.model, config.trainer, policy_version=start),
                name="clawrl-load",
            )
            metrics = MetricsWriter.from_config(config.trainer.output_dir, config)
            owned.append(metrics.close)
            harness_learner = Learner(trainer, store, engines=[engine], metrics=metrics)
            if method.needs.step_scores and judge is None:  # PRM + outcome judges each turn
                judge = call_in_transient_thread(build_judge, config, name="clawrl-load")
                owned.append(judge.close)
        learner = service.trainer if service is not None else trainer
        if learner is not None:
            call_in_transient_thread(_serve_base_through_zero_adapter, engine, learner, config)
        name = model_name or (Path(spec).name if Path(spec).is_dir() else spec)
        lifespan = service.lifespan if service is not None else None
        follower = None
        if lifespan is None and online and config.server.version_poll_s > 0:
            # a replica that does not train serves what the trainer published (gateway.versions)
            from clawrl.gateway.versions import VersionFollower

            follower = VersionFollower(store, engine, config.server.version_poll_s)
            lifespan = follower.lifespan
        memory = keeper if config.memory.enabled else None
        user_adapters = None
        if config.server.per_user_adapters:  # in-process only (Config checks it)
            from clawrl.gateway.user_adapters import UserAdapters

            user_adapters = UserAdapters(store, engine, config.server.version_poll_s or 2.0,
                                         trained=service is not None)  # fmt: skip
        app = create_app(
            engine, policy.tokenizer, store, model_name=name, api_key=api_key, user_keys=user_keys,
            defaults=config.sampling, lifespan=lifespan, memory=memory, memory_admin=keeper,
            user_from=config.server.user_from, user_adapters=user_adapters,
        )  # fmt: skip
        dashboard = mount_dashboard(app, DashboardSource(
            store, output_dir=Path(config.trainer.output_dir) if method.trains else None,
            status=service.status if service is not None else None,
            policy_version=lambda: engine.policy_version, title=f"{name} · {method.kind}",
            judging=service is not None or (trainer is not None and method.needs.step_scores),
            memory_enabled=memory is not None,
        ))  # fmt: skip
    except BaseException:
        for closer in reversed(owned):
            with contextlib.suppress(Exception):
                closer()
        raise
    return Runtime(
        config=config, policy=policy, engine=engine, store=store, app=app, model_name=name,
        service=service, trainer=trainer, learner=harness_learner,
        judge=judge if service is not None or method.needs.step_scores else None,
        dashboard=dashboard, follows_versions=follower is not None, follower=follower,
        _owned=owned,
    )  # fmt: skip


@dataclass
class ReplayGateway:
    """A gateway over a :class:`clawrl.engine.scripted.ScriptedEngine`: harness mode's warm
    start replays recorded commands through a harness with it (:mod:`clawrl.harness.warmstart`),
    recording into the run's store like the policy's own gateway.

    Attributes:
        engine: the scripted engine (the warm start sets each rollout's replies on it).
        app: the gateway app over it (for :class:`clawrl.harness.loop.HarnessRunner`).
    """

    engine: ScriptedEngine
    app: FastAPI


def build_replay_gateway(policy: Policy, store: Store, *, model_name: str) -> ReplayGateway:
    """The warm start's gateway: ``policy``'s tokenizer and chat template over a scripted
    engine, recording into ``store`` under ``model_name`` (the policy's served name)."""
    from clawrl.engine.scripted import ScriptedEngine
    from clawrl.gateway import create_app

    engine = ScriptedEngine(policy.tokenizer)
    return ReplayGateway(engine, create_app(engine, policy.tokenizer, store, model_name=model_name))


def build_judge_worker(
    config: Config, *, store: Store | str | Path | None = None, judge: JudgeBundle | None = None
) -> tuple[JudgeWorker, Callable[[], None]]:
    """``clawrl judge worker``: a :class:`~clawrl.judge.worker.JudgeWorker` over the
    store, judging every turn that has a next state with the judge of ``config.judge``.

    Args:
        config: all settings (``judge``; ``server.store`` unless ``store`` is given).
        store: the store or its target (a store passed in stays the caller's).
        judge: a judge to use instead of building one (tests).

    Returns:
        ``(worker, close)``: ``close`` closes what was built here (the judge's engine, the store).

    Raises:
        ModelError, JudgeError, StoreError: a part cannot be built (what was built is closed).
    """
    from clawrl.judge.worker import JudgeWorker

    owned: list[Callable[[], None]] = []

    def close() -> None:
        for closer in reversed(owned):
            with contextlib.suppress(Exception):
                closer()

    try:
        if not isinstance(store, Store):
            store = Store(store if store is not None else config.server.store)
            owned.append(store.close)
        if judge is None:
            judge = build_judge(config)
            owned.append(judge.close)
        # the judge keeps its own deadline; the worker's is a guard for judges that do not
        worker = JudgeWorker(store, judge.judge, timeout_s=config.judge.timeout_s + 30.0)
    except BaseException:
        close()
        raise
    return worker, close


def build_trainer_process(
    config: Config,
    env: DistEnv,
    *,
    policy: Policy | None = None,
    out: Callable[[str], None] = print,
) -> TrainerProcess:
    """``clawrl train`` on one rank: the policy (``config.model``, loaded by every rank), the
    sharded trainer (:class:`~clawrl.trainer.fsdp.ShardedTrainer`, computing its own OPD
    teacher), and on rank 0 the store (``server.store``) and the metrics writer
    (``trainer.output_dir``). Not yet resumed: call ``resume()``.

    Raises:
        ConfigError: the method trains nothing or needs harness rollout groups (``grpo``:
            ``clawrl harness train``), or ``trainer.checkpoint_every`` is not 1.
        ModelError, StoreError: the policy or the store cannot be opened.
    """
    from clawrl.trainer.fsdp import ShardedTrainer
    from clawrl.trainer.metrics import MetricsWriter
    from clawrl.trainer.process import TrainerProcess

    method = config.trainer.method
    if not method.trains:
        raise ConfigError("clawrl train needs a training method (--method rl|opd|combine)")
    if method.needs.group:
        raise ConfigError(f"method {method.kind!r} needs rollout groups: use it in harness "
                          "mode (clawrl harness train)")  # fmt: skip
    if config.memory.distill and not method.needs.uses_hint:
        raise ConfigError(f"memory.distill needs a method with a teacher (opd or combine), not "
                          f"{method.kind!r}")  # fmt: skip
    if policy is None:
        policy = load_model(config.model_copy(update={
            "model": config.model.model_copy(update={"device": "cpu"})}))  # fmt: skip
    trainer = ShardedTrainer(policy.model, config.trainer, env, computes_teacher=True)
    store = metrics = keeper = None
    if env.is_main:
        store = Store(config.server.store)
        metrics = MetricsWriter.from_config(config.trainer.output_dir, config)
        if config.memory.distill:  # the gateways take the directives; this one retires them
            from clawrl.memory import MemoryKeeper

            keeper = MemoryKeeper(store, max_entries=config.memory.max_entries,
                                  retire_gap=config.memory.retire_gap,
                                  retire_turns=config.memory.retire_turns)  # fmt: skip
    return TrainerProcess(
        trainer, env, config.trainer, store=store, tokenizer=policy.tokenizer,
        max_context=policy.max_context, metrics=metrics, out=out, memory=keeper,
    )  # fmt: skip
