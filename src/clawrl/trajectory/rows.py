"""Training rows: each path of ``prefix`` links of a :class:`SessionTree`, flattened to ids.

A row runs from a row start (a root, or a turn linked to its parent by ``history_rewritten``)
down ``prefix`` links to a row end (a turn with no ``prefix`` child,
:meth:`SessionTree.row_ends`); its ``input_ids`` are the end turn's
``prompt_ids + completion_ids``. By the parent rule every turn on the row has its own
``prompt_ids + completion_ids`` as a prefix of them, so each turn's sampled tokens sit at
``[len(prompt_ids), len(prompt_ids) + len(completion_ids))``. A ``history_rewritten`` link is
never crossed: the child's prompt holds the template's re-rendering of the parent's answer, not
the sampled ids, so the parent's row ends with its own sampled ids and the child starts a row
with its own prompt (nothing is re-tokenized).

Loss-mask rule: mask 1 exactly on tokens sampled by a *trainable* turn, in the one row that
*owns* the turn; 0 on prompts, environment tokens and context copies. Rows are enumerated
depth-first over every link (roots by creation, children by
:meth:`SessionTree.ordered_children`, i.e. the next-state child first) and a turn is owned by the
first row whose path contains it: the path that follows each turn's next-state child when that
child is linked by ``prefix``. So every sampled token of a trainable turn has mask 1 in exactly
one row, and a shared prefix (a turn with retries or branches after it) is trained once.
Untrainable turns get mask 0 everywhere; their reason is listed in the owning row's
``untrained``. Every row end gives a row, even when all its tokens are context (the trainer
skips rows with no mask-1 token).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from clawrl.trajectory.tree import SessionTree


@dataclass
class TrainingRow:
    """One flattened row: a path of ``prefix`` links.

    Attributes:
        session_id: the session.
        turn_ids: the row's turns, its start first; ``turn_ids[-1]`` is its end (a leaf of the
            ``prefix`` links).
        input_ids: token ids, shape ``[n]`` (the end turn's prompt + completion).
        loss_mask: 1 on trained sampled tokens, else 0, shape ``[n]``.
        sampling_logprobs: the engine's sampling log-probs where ``loss_mask`` is 1, else 0.0,
            shape ``[n]``.
        token_turn: per token, the index into ``turn_ids`` of the turn that sampled it, -1 for
            prompt / environment tokens, shape ``[n]`` (context copies keep their turn index).
        policy_versions: policy version per path turn, aligned with ``turn_ids``.
        trained_turn_ids: turns whose tokens have mask 1 in this row.
        untrained: turns this row owns but does not train, with the reason.
    """

    session_id: str | None
    turn_ids: list[str]
    input_ids: list[int]
    loss_mask: list[int]
    sampling_logprobs: list[float]
    token_turn: list[int]
    policy_versions: list[int]
    trained_turn_ids: list[str] = field(default_factory=list)
    untrained: dict[str, str] = field(default_factory=dict)

    @property
    def leaf_turn_id(self) -> str:
        return self.turn_ids[-1]

    @property
    def num_trained_tokens(self) -> int:
        return sum(self.loss_mask)


def training_rows(tree: SessionTree) -> list[TrainingRow]:
    """One :class:`TrainingRow` per row end of ``tree``, masked by the module's loss-mask rule."""
    owned: set[str] = set()
    rows: list[TrainingRow] = []
    for leaf_id in tree.row_ends():
        path = tree.row_path(leaf_id)
        leaf = tree.node(leaf_id).turn
        input_ids = [*leaf.prompt_ids, *leaf.completion_ids]
        n = len(input_ids)
        mask, logprobs, token_turn = [0] * n, [0.0] * n, [-1] * n
        row = TrainingRow(
            session_id=tree.session_id,
            turn_ids=path,
            input_ids=input_ids,
            loss_mask=mask,
            sampling_logprobs=logprobs,
            token_turn=token_turn,
            policy_versions=[tree.node(t).turn.policy_version for t in path],
        )
        for index, turn_id in enumerate(path):
            node = tree.node(turn_id)
            turn = node.turn
            start, end = len(turn.prompt_ids), len(turn.prompt_ids) + len(turn.completion_ids)
            token_turn[start:end] = [index] * (end - start)
            if turn_id in owned:
                continue
            owned.add(turn_id)
            if node.untrainable_reason is not None:
                row.untrained[turn_id] = str(node.untrainable_reason)
                continue
            mask[start:end] = [1] * (end - start)
            logprobs[start:end] = turn.sampling_logprobs
            row.trained_turn_ids.append(turn_id)
        rows.append(row)
    return rows
