"""Building a simulated user from the scenario and the kind (what the CLI and the demo call)."""

from __future__ import annotations

from clawrl.envs.llm_user import LLMUser
from clawrl.envs.student import RuleStudent
from clawrl.envs.teacher import RuleTeacher
from clawrl.envs.user import Scenario, SimulatedUser, UserKind
from clawrl.errors import ConfigError


def make_user(
    scenario: Scenario | str,
    kind: UserKind | str = UserKind.RULE,
    *,
    seed: int = 0,
    user_url: str | None = None,
    user_model: str | None = None,
    user_api_key: str | None = None,
    flaw_rate: float = 0.5,
) -> SimulatedUser:
    """The simulated user of ``scenario``.

    Args:
        scenario: ``student`` or ``teacher``.
        kind: ``rule`` (default: deterministic rubric) or ``llm`` (needs ``user_url`` and
            ``user_model``).
        seed: seeds tasks and phrasings (and the LLM's sampling).
        user_url: the LLM user's OpenAI-compatible base URL.
        user_model: the LLM user's model name.
        user_api_key: the LLM user's API key, if its endpoint needs one.
        flaw_rate: teacher only: fraction of worked solutions with a planted slip, in [0, 1].

    Raises:
        ConfigError: unknown scenario or kind, or an LLM user without URL or model, or with
            a malformed URL.
    """
    try:
        scenario = Scenario(scenario)
        kind = UserKind(kind)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if kind is UserKind.LLM:
        if not user_url or not user_model:
            raise ConfigError("an LLM user needs --user-url and --user-model")
        try:
            return LLMUser(
                scenario,
                url=user_url,
                model=user_model,
                api_key=user_api_key,
                seed=seed,
                flaw_rate=flaw_rate,
            )
        except ValueError as e:
            raise ConfigError(f"--user-url: {e}") from e
    if scenario is Scenario.STUDENT:
        return RuleStudent(seed=seed)
    return RuleTeacher(seed=seed, flaw_rate=flaw_rate)
