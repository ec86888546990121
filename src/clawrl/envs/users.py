"""Building a simulated user from a scenario and a kind (what the CLI and the demo call)."""

from __future__ import annotations

from pathlib import Path

from clawrl.envs.llm_user import LLMUser
from clawrl.envs.rule_user import RuleUser
from clawrl.envs.scenario import ScenarioSpec, load_scenario
from clawrl.envs.user import SimulatedUser, UserKind
from clawrl.errors import ConfigError


def make_user(
    scenario: ScenarioSpec | str | Path,
    kind: UserKind | str = UserKind.RULE,
    *,
    seed: int = 0,
    user_url: str | None = None,
    user_model: str | None = None,
    user_api_key: str | None = None,
) -> SimulatedUser:
    """The simulated user of ``scenario``.

    Args:
        scenario: a built-in scenario's name (``student``, ``teacher``, ``parent``), a scenario file, or a
            loaded :class:`~clawrl.envs.scenario.ScenarioSpec`.
        kind: ``rule`` (default: the scenario's rubric and phrase banks) or ``llm`` (an LLM
            role-plays the user; needs ``user_url`` and ``user_model``).
        seed: seeds tasks and phrasings (and the LLM's sampling).
        user_url: the LLM user's OpenAI-compatible base URL.
        user_model: the LLM user's model name.
        user_api_key: the LLM user's API key, if its endpoint needs one.

    Raises:
        ConfigError: an unknown or malformed scenario, an unknown kind, or an LLM user without
            URL or model, or with a malformed URL.
    """
    spec = scenario if isinstance(scenario, ScenarioSpec) else load_scenario(scenario)
    try:
        kind = UserKind(kind)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if kind is UserKind.LLM:
        if not user_url or not user_model:
            raise ConfigError("an LLM user needs --user-url and --user-model")
        try:
            return LLMUser(spec, url=user_url, model=user_model, api_key=user_api_key, seed=seed)
        except ValueError as e:
            raise ConfigError(f"--user-url: {e}") from e
    return RuleUser(spec, seed=seed)
