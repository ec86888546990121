"""The trained (head) judge on the tiny model: training, saving, votes, abstention, identity."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import torch

from clawrl.errors import JudgeError
from clawrl.judge import Judge
from clawrl.judge.backends.head import HeadBackend
from clawrl.judge.cases import (
    blind_b_cases_path,
    blind_cases_path,
    default_cases_path,
    load_cases,
)
from clawrl.judge.head import (
    CLASSES,
    FeatureExtractor,
    HeadSet,
    fit_probe,
    layer_indices,
    model_identity,
    next_state_view,
)
from clawrl.judge.head_training import train_head_set
from clawrl.judge.synthetic import synthetic_cases
from clawrl.judge.types import AbstainReason, JudgeInput, NextStateRole, Score
from clawrl.models import tiny_policy


@pytest.fixture(scope="module")
def tiny_head(tmp_path_factory):
    policy = tiny_policy(seed=5, max_context=256)
    extractor = FeatureExtractor(policy.model, policy.tokenizer)
    train = synthetic_cases(120, split="train", seed=1)
    val = synthetic_cases(60, split="val", seed=1)
    head = train_head_set(extractor, train, val, probes=6, l2_grid=(0.1,), seed=0)
    path = head.save(tmp_path_factory.mktemp("head") / "head.safetensors")
    return policy, extractor, head, path


def _inp(role: NextStateRole, text: str) -> JudgeInput:
    return JudgeInput.model_validate(
        {
            "context": {"user": "What is 2+2?"},
            "output": {"content": "4"},
            "next_state": {"role": role.value, "text": text},
        }
    )


def test_layers_and_view():
    assert layer_indices(30) == [10, 15, 20, 30] and layer_indices(2) == [1, 2]
    assert next_state_view(_inp(NextStateRole.USER, "  thanks ")) == "User: thanks"
    assert next_state_view(_inp(NextStateRole.TOOL, "")) == "Output: (empty)"


def test_fit_probe_learns_a_separable_problem():
    gen = torch.Generator().manual_seed(0)
    centers = torch.tensor([[-3.0, 0.0], [0.0, 3.0], [3.0, 0.0]])
    labels = torch.arange(3).repeat(40)
    x = centers[labels] + 0.3 * torch.randn(len(labels), 2, generator=gen)
    probe = fit_probe(x, labels, torch.arange(2), l2=1e-3, name="t")
    assert bool((probe.probs(x).argmax(-1) == labels).all())
    # bootstrap weights of 0 remove examples from the fit: a class seen nowhere is not learned
    w = (labels != 2).double()
    partial = fit_probe(x, labels, torch.arange(2), l2=1e-3, name="t", sample_weight=w)
    assert float(partial.probs(x[labels == 2])[:, 2].max()) < 0.5


def test_a_head_set_round_trips_through_its_file(tiny_head):
    _, extractor, head, path = tiny_head
    loaded = HeadSet.load(path)
    assert loaded.identity == extractor.identity == head.identity
    assert [p.name for p in loaded.probes] == [p.name for p in head.probes]
    assert loaded.probes[0].name == "all/full" and len({p.name for p in loaded.probes}) == 6
    x = extractor.features(["User: thanks a lot"])
    for a, b in zip(head.probes, loaded.probes, strict=True):
        assert torch.allclose(a.probs(x), b.probs(x))
    assert loaded.facts["train_cases"] == 120 and "l2_scan_val_accuracy" in loaded.facts
    assert loaded.min_confidence == pytest.approx(head.min_confidence)


def test_votes_are_independent_probes(tiny_head):
    policy, _, head, path = tiny_head
    backend = HeadBackend(policy.model, policy.tokenizer, head=path, min_confidence=0.0)
    votes = asyncio.run(backend.votes(_inp(NextStateRole.USER, "no, that's wrong"), range(6)))
    raws = [json.loads(v.raw) for v in votes]
    assert [r["probe"] for r in raws] == [p.name for p in head.probes]
    assert len({tuple(r[c.label] for c in CLASSES) for r in raws}) == 6  # six different judgments
    assert all(v.score is not None for v in votes)


@pytest.mark.parametrize(
    "text", ["great, but give distances in km please", "no, that's wrong. use km please"]
)
def test_each_vote_reads_the_reply_as_its_own_score_says(tiny_head, text):
    """hints="bad-or-gate": a vote that scores -1 or whose gate fires looks for a directive,
    request forms only where the vote scores -1 (or the sentence turns from praise to a
    request); hints="gate": only votes whose gate fires look, reading every reply as a
    correction."""
    from clawrl.judge.hints import extract_directive

    policy, _, _, path = tiny_head
    inp = _inp(NextStateRole.USER, text)
    for rule in ("bad-or-gate", "gate"):
        backend = HeadBackend(
            policy.model, policy.tokenizer, head=path, min_confidence=0.0, hints=rule
        )
        votes = asyncio.run(backend.votes(inp, range(6)))
        for v in votes:
            gate = json.loads(v.raw)["hint_gate"]
            look = gate >= 0.5 or (rule == "bad-or-gate" and v.score == Score.BAD)
            negative = rule == "gate" or v.score == Score.BAD
            found = extract_directive(text, NextStateRole.USER, negative=negative) if look else None
            assert v.hint == (found.text if found else None), (rule, v.score, gate)
    with pytest.raises(JudgeError, match="'bad-or-gate' or 'gate'"):
        HeadBackend(policy.model, policy.tokenizer, head=path, hints="always")


def test_the_judge_model_runs_in_a_thread_that_ends(tiny_head, monkeypatch):
    """A live thread that ran the judge model would keep an OpenMP team slowing the policy
    engine's thread (clawrl.engine.threads): each forward pass gets a thread of its own."""
    policy, _, _, path = tiny_head
    backend = HeadBackend(policy.model, policy.tokenizer, head=path, min_confidence=0.0)
    threads: list[threading.Thread] = []
    features = backend.extractor.features

    def recording(views):
        threads.append(threading.current_thread())
        return features(views)

    monkeypatch.setattr(backend.extractor, "features", recording)

    async def two_judgments():
        for text in ("no, that's wrong", "thanks, perfect"):
            await backend.votes(_inp(NextStateRole.USER, text), range(2))
        # inside the loop: asyncio.run joins an executor's idle workers on its way out
        for thread in threads:
            thread.join(timeout=3)
            assert thread is not threading.main_thread() and not thread.is_alive()

    asyncio.run(two_judgments())
    assert len(threads) == 2


def test_low_confidence_votes_abstain(tiny_head):
    policy, _, _, path = tiny_head
    backend = HeadBackend(policy.model, policy.tokenizer, head=path, min_confidence=0.999)
    votes = asyncio.run(backend.votes(_inp(NextStateRole.USER, "hmm"), [0, 1]))
    assert all(v.score is None and v.abstain_reason == AbstainReason.LOW_MARGIN for v in votes)
    judgment = asyncio.run(Judge(backend, votes=2).judge(_inp(NextStateRole.USER, "hmm")))
    assert judgment.score is None


def test_empty_program_output_is_neutral_without_the_model(tiny_head):
    policy, _, _, path = tiny_head
    backend = HeadBackend(policy.model, policy.tokenizer, head=path)
    backend.extractor.features = None  # would raise if called
    votes = asyncio.run(backend.votes(_inp(NextStateRole.TOOL, "  "), [0, 1, 2]))
    assert [v.score for v in votes] == [Score.NEUTRAL] * 3


@pytest.mark.parametrize(
    "role", [NextStateRole.TOOL, NextStateRole.ENVIRONMENT], ids=["tool", "environment"]
)
def test_a_nonzero_exit_status_is_bad_without_the_model(tiny_head, role):
    policy, _, _, path = tiny_head
    backend = HeadBackend(policy.model, policy.tokenizer, head=path)
    backend.extractor.features = None  # would raise if called
    text = "Output:\nsh: 1: sudo: not found\n\n(exit code 127)"
    votes = asyncio.run(backend.votes(_inp(role, text), [0, 1, 2]))
    assert [v.score for v in votes] == [Score.BAD] * 3
    assert json.loads(votes[0].raw) == {"rule": "exit_status"} and "127" in votes[0].detail


def test_exit_status_zero_and_a_user_quoting_a_status_go_to_the_model(tiny_head):
    policy, _, _, path = tiny_head
    backend = HeadBackend(policy.model, policy.tokenizer, head=path)
    calls = []
    features = backend.extractor.features
    backend.extractor.features = lambda texts: calls.append(texts) or features(texts)
    for inp in (
        _inp(NextStateRole.TOOL, "Output:\n(exit code 0)"),
        _inp(NextStateRole.USER, "it failed with exit code 1, fix it"),
    ):
        votes = asyncio.run(backend.votes(inp, [0]))
        assert "rule" not in json.loads(votes[0].raw)
    assert len(calls) == 2


def test_more_votes_than_probes_is_refused(tiny_head):
    policy, _, _, path = tiny_head
    backend = HeadBackend(policy.model, policy.tokenizer, head=path)
    with pytest.raises(JudgeError, match="6 probes"):
        asyncio.run(backend.votes(_inp(NextStateRole.USER, "ok"), range(7)))


def test_a_head_of_another_model_is_refused(tiny_head):
    _, _, _, path = tiny_head
    other = tiny_policy(seed=6, max_context=256)
    assert model_identity(other.model, other.tokenizer) != HeadSet.load(path).identity
    with pytest.raises(JudgeError, match="clawrl judge train"):
        HeadBackend(other.model, other.tokenizer, head=path)


def test_a_head_of_the_same_model_with_an_adapter_merged_in_is_refused(tiny_head):
    # A LoRA adapter merged into the base (clawrl export-model) changes the attention and MLP
    # weights and leaves the input embeddings as they were: the identity must still differ.
    _, _, _, path = tiny_head
    merged = tiny_policy(seed=5, max_context=256)
    assert model_identity(merged.model, merged.tokenizer) == HeadSet.load(path).identity
    emb_before = merged.model.get_input_embeddings().weight.detach().clone()
    name, weight = next(
        (n, w) for n, w in merged.model.named_parameters() if "proj" in n and w.dim() == 2
    )
    with torch.no_grad():
        weight.add_(1e-3 * torch.ones_like(weight))
    assert torch.equal(merged.model.get_input_embeddings().weight, emb_before), name
    assert model_identity(merged.model, merged.tokenizer) != HeadSet.load(path).identity
    with pytest.raises(JudgeError, match=r"leave judge\.model unset"):
        HeadBackend(merged.model, merged.tokenizer, head=path)


def test_synthetic_splits_share_no_person_reply():
    train = {c.input.next_state.text for c in synthetic_cases(2000, split="train")}
    val = synthetic_cases(800, split="val")
    person = [c for c in val if c.input.next_state.role == NextStateRole.USER]
    overlap = [c.input.next_state.text for c in person if c.input.next_state.text in train]
    assert len(overlap) / len(person) < 0.02, overlap[:5]


def test_synthetic_cases_are_deterministic_and_labeled_by_the_rule():
    a, b = synthetic_cases(300, seed=3), synthetic_cases(300, seed=3)
    assert [c.model_dump() for c in a] == [c.model_dump() for c in b]
    for c in a:
        if c.category.value == "correction":
            assert c.expected_score == Score.BAD and c.has_hint and c.reference_hint
        if c.category.value in ("redo", "complaint", "tool_error", "test_fail"):
            assert c.expected_score == Score.BAD
        if c.category.value == "neutral":
            assert c.expected_score == Score.NEUTRAL


def test_synthetic_data_does_not_copy_the_labeled_sets():
    """Training data must not contain the people's replies of the sets it is measured on
    (short generic replies such as "brb" and canonical program messages may coincide)."""

    def replies(cases):
        return {
            " ".join(c.input.next_state.text.lower().split())
            for c in cases
            if c.input.next_state.role == NextStateRole.USER
            and len(c.input.next_state.text.split()) >= 5
        }

    held_out = (
        replies(load_cases(default_cases_path()))
        | replies(load_cases(blind_cases_path()))
        | replies(load_cases(blind_b_cases_path()))
    )
    made = replies(synthetic_cases(8000, split="all"))
    assert not made & held_out
