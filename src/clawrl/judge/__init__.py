"""The PRM judge: majority-voted turn scores (+1 / -1 / 0) and hindsight hints from next states.

Usage::

    backend = ChoiceBackend(engine, tokenizer, model="smollm2-135m")
    judge = Judge(backend, votes=3, timeout_s=30)
    judgment = await judge.judge(JudgeInput(context=..., output=..., next_state=...))
    judgment.score, judgment.hint, judgment.votes

Rules, each documented where it is implemented:

* **Scores** — +1 when the next state shows the turn worked, -1 when it shows failure or a
  correction, 0 when it carries no evidence (:mod:`clawrl.judge.prompts`).
* **Vote format** — the designated final field is the last line starting with ``Score:``; prose
  before it never counts; anything else is an abstention with a reason (:mod:`.parse`).
* **Majority** — plurality of valid votes; a tie gives 0; all abstentions give no judgment with
  its reason (:mod:`.votes`).
* **Hints** — between ``<hint>`` and ``</hint>``; empty, too short, too long or unterminated means
  none; among votes, a quorum of half the valid votes, then the candidate with the highest mean
  ROUGE-1 F1 against the others (:mod:`.hints`). Choice mode copies directive sentences from
  the next state instead (:func:`extract_directive`).
* **Backends** — generative (local engine, m seeded samples batched together), choice (calibrated
  verdict log-probs in one forward pass), OpenAI-compatible endpoint (timeouts, bounded retries)
  (:mod:`.backends`).
* **Explicit feedback** (role ``feedback`` with a reward) is used as given, without votes.
* **Never blocking** — :meth:`Judge.judge` returns within its timeout; failures are abstentions.
"""

from clawrl.config.judge import (
    ChoiceJudgeConfig,
    GenerativeJudgeConfig,
    HeadJudgeConfig,
    JudgeConfig,
    OpenAIJudgeConfig,
)
from clawrl.judge.cases import CaseCategory, JudgeCase, default_cases_path, load_cases
from clawrl.judge.hints import extract_directive, overlap_f1, select_hint
from clawrl.judge.judge import Judge, feedback_judgment
from clawrl.judge.parse import parse_hint, parse_score
from clawrl.judge.types import (
    AbstainReason,
    BackendKind,
    Hint,
    HintSelection,
    HintStatus,
    JudgeContext,
    JudgeInput,
    Judgment,
    NextStateRole,
    NextStateText,
    NoJudgmentReason,
    Score,
    TurnOutput,
    Vote,
)
from clawrl.judge.votes import Tally, majority

__all__ = [
    "AbstainReason",
    "BackendKind",
    "CaseCategory",
    "ChoiceJudgeConfig",
    "GenerativeJudgeConfig",
    "HeadJudgeConfig",
    "Hint",
    "HintSelection",
    "HintStatus",
    "Judge",
    "JudgeCase",
    "JudgeConfig",
    "JudgeContext",
    "JudgeInput",
    "Judgment",
    "NextStateRole",
    "NextStateText",
    "NoJudgmentReason",
    "OpenAIJudgeConfig",
    "Score",
    "Tally",
    "TurnOutput",
    "Vote",
    "default_cases_path",
    "extract_directive",
    "feedback_judgment",
    "load_cases",
    "majority",
    "overlap_f1",
    "parse_hint",
    "parse_score",
    "select_hint",
]
