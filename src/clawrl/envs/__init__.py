"""Scenarios: simulated users, problem data and personalization evaluation (issue 7).

=================  ===================================================================
module             does
=================  ===================================================================
``problems``       :class:`Problem`, the seeded word-problem generator, the split
``data``           GSM8K-format JSONL loader, :func:`problem_split` (either source)
``solutions``      students' worked solutions, correct or with a known slip (teacher)
``rubric``         :class:`Rubric` of named checks, score = fraction met
``checks``         the check kinds a scenario's rubric is built from
``scenario``       scenario files (TOML): :func:`load_scenario`, :class:`ScenarioSpec`
``rule_user``      :class:`RuleUser`: the rule-based user of any scenario file
``llm_user``       :class:`LLMUser`: any OpenAI-compatible model role-plays the user
``user``           the :class:`SimulatedUser` protocol and its types
``users``          :func:`make_user`
``client``         :class:`ChatClient`: httpx, OpenAI wire format, sessions, eval marker
``sessions``       :func:`run_sessions`: training conversations against the gateway
``evaluate``       :func:`evaluate_personalization`: first answers scored by the rubric
``agreement``      :func:`judge_agreement`: the PRM judge versus the simulator's truth
=================  ===================================================================

Nothing here imports torch: the simulated users are clients of the gateway like any app.
"""

from clawrl.envs.agreement import Agreement, judge_agreement
from clawrl.envs.client import EVAL_HEADER, ChatClient, ChatResult
from clawrl.envs.data import load_gsm8k, problem_split
from clawrl.envs.errors import ChatEndpointError, DatasetError
from clawrl.envs.evaluate import (
    EVAL_SESSION_PREFIX,
    EvalItem,
    EvalResult,
    aevaluate_personalization,
    evaluate_personalization,
)
from clawrl.envs.llm_user import LLMUser
from clawrl.envs.problems import (
    TEMPLATES,
    Problem,
    ProblemSplit,
    generate_problem,
    generate_problems,
    split_problems,
)
from clawrl.envs.rubric import Check, CheckResult, Rubric, RubricResult
from clawrl.envs.rule_user import RuleUser
from clawrl.envs.scenario import ScenarioSpec, load_scenario
from clawrl.envs.sessions import SessionLog, TurnLog, arun_sessions, run_session, run_sessions
from clawrl.envs.solutions import Flaw, FlawKind, WorkedSolution, make_worked_solution
from clawrl.envs.user import Assessment, Scenario, SimulatedUser, Task, UserKind, UserReply
from clawrl.envs.users import make_user

__all__ = [
    "EVAL_HEADER",
    "EVAL_SESSION_PREFIX",
    "TEMPLATES",
    "Agreement",
    "Assessment",
    "ChatClient",
    "ChatEndpointError",
    "ChatResult",
    "Check",
    "CheckResult",
    "DatasetError",
    "EvalItem",
    "EvalResult",
    "Flaw",
    "FlawKind",
    "LLMUser",
    "Problem",
    "ProblemSplit",
    "Rubric",
    "RubricResult",
    "RuleUser",
    "Scenario",
    "ScenarioSpec",
    "SessionLog",
    "SimulatedUser",
    "Task",
    "TurnLog",
    "UserKind",
    "UserReply",
    "WorkedSolution",
    "aevaluate_personalization",
    "arun_sessions",
    "evaluate_personalization",
    "generate_problem",
    "generate_problems",
    "judge_agreement",
    "load_gsm8k",
    "load_scenario",
    "make_user",
    "make_worked_solution",
    "problem_split",
    "run_session",
    "run_sessions",
    "split_problems",
]
