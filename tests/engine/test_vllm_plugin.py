"""clawrl's vLLM server plugin (:mod:`clawrl.engine.vllm.server_plugin`) without a server: the
entry point it writes is found by ``importlib.metadata``; its wrapper scales exactly the logits of
the prompt slices whose requests asked for a temperature, found by where they start; a slice it
cannot place fails the step; other vLLM code is left alone. The real server's behaviour is
checked in ``test_vllm_engine.py``."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from clawrl.engine.vllm import protocol, server_plugin


def test_the_request_key_is_the_one_the_plugin_reads():
    assert protocol.PROMPT_TEMPERATURE_KEY == server_plugin.NAME
    body = protocol.prompt_logprobs_body("m", [1, 2], [3], 0.7)
    assert body["vllm_xargs"] == {server_plugin.NAME: 0.7}
    assert "vllm_xargs" not in protocol.prompt_logprobs_body("m", [1, 2], [3], 1.0)


def test_plugin_dir_registers_an_entry_point_vllm_finds(tmp_path):
    where = server_plugin.plugin_dir(tmp_path / "plugin")
    code = (
        "from importlib.metadata import entry_points\n"
        "eps = entry_points(group='vllm.general_plugins')\n"
        "ep = next(e for e in eps if e.name == 'clawrl_prompt_temperature')\n"
        "print(ep.value, ep.load().__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(where)},
                         capture_output=True, text=True, check=True)  # fmt: skip
    assert out.stdout.split() == ["clawrl_vllm_plugin:register", "clawrl_vllm_plugin"]


class _Model:
    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    def compute_logits(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.weight


def _original(self, hidden_states, num_scheduled_tokens):
    """The shape of vLLM 0.32's method: per request, the logits of its slice of the step's
    hidden states, then log-probs (here: all of them)."""
    out = {}
    for req_id in self.num_prompt_logprobs:
        n = num_scheduled_tokens.get(req_id)
        if n is None:
            continue
        request = self.requests[req_id]
        left = len(request.prompt_token_ids) - request.num_computed_tokens - 1
        num_logits = min(n, left)
        if num_logits <= 0:
            continue
        offset = self.query_start_loc.np[self.input_batch.req_id_to_index[req_id]].item()
        prompt_hidden_states = hidden_states[offset : offset + num_logits]
        logits = self.model.compute_logits(prompt_hidden_states)
        out[req_id] = torch.log_softmax(logits.float(), -1)
    return out


def _runner(temps: dict[str, float | None], lengths: dict[str, int]):
    weight = torch.randn(4, 7, generator=torch.Generator().manual_seed(0))
    ids = list(lengths)
    starts = np.r_[0, np.cumsum([lengths[r] for r in ids])]

    runner = SimpleNamespace(
        model=_Model(weight),
        num_prompt_logprobs={r: 0 for r in ids},
        input_batch=SimpleNamespace(
            req_id_to_index={r: i for i, r in enumerate(ids)}, num_reqs=len(ids)
        ),
        query_start_loc=SimpleNamespace(np=starts),
        requests={},
    )
    for r in ids:
        extra = {server_plugin.NAME: temps[r]} if temps[r] is not None else None
        runner.requests[r] = SimpleNamespace(
            prompt_token_ids=[0] * lengths[r], num_computed_tokens=0,
            sampling_params=SimpleNamespace(extra_args=extra),
        )  # fmt: skip
    hidden = torch.randn(int(starts[-1]), 4, generator=torch.Generator().manual_seed(1))
    return runner, hidden, {r: lengths[r] for r in ids}


def test_the_wrapper_scales_only_the_requests_that_ask():
    runner, hidden, scheduled = _runner({"a": 0.5, "b": None, "c": 2.0}, {"a": 3, "b": 4, "c": 5})
    plain = _original(runner, hidden, scheduled)
    got = server_plugin._wrap(_original)(runner, hidden, scheduled)
    w = runner.model.weight
    assert torch.allclose(got["b"], plain["b"])
    assert torch.allclose(got["a"], torch.log_softmax(hidden[0:2] @ w / 0.5, -1))
    assert torch.allclose(got["c"], torch.log_softmax(hidden[7:11] @ w / 2.0, -1))
    assert "compute_logits" not in runner.model.__dict__  # the method is restored


def test_a_chunked_prefill_scales_each_chunk_and_skips_a_chunk_with_no_position_left():
    """With chunked prefill a request's prompt log-probs come over several steps; a last chunk
    may compute no prompt position (vLLM asks for no logits then)."""
    runner, hidden, scheduled = _runner({"a": 0.5, "b": 2.0}, {"a": 3, "b": 3})
    runner.requests["a"].prompt_token_ids = [0] * 9
    runner.requests["a"].num_computed_tokens = 5  # 3 more this step: positions 5..7
    runner.requests["b"].prompt_token_ids = [0] * 4
    runner.requests["b"].num_computed_tokens = 3  # its last chunk: no position left
    got = server_plugin._wrap(_original)(runner, hidden, scheduled)
    w = runner.model.weight
    assert set(got) == {"a"}
    assert torch.allclose(got["a"], torch.log_softmax(hidden[0:3] @ w / 0.5, -1))


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), "0.7", True, None])
def test_a_temperature_that_is_not_a_finite_positive_number_is_refused(value):
    if value is None:
        assert server_plugin._temperature(SimpleNamespace(sampling_params=None)) is None
        return
    with pytest.raises(ValueError, match=server_plugin.NAME):
        server_plugin._valid(value)


def test_plugin_dir_replaces_another_versions_record(tmp_path):
    old = tmp_path / f"{server_plugin.MODULE}-0.dist-info"
    old.mkdir()
    (old / "entry_points.txt").write_text("[vllm.general_plugins]\nx = y:z\n")
    server_plugin.plugin_dir(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.dist-info")) == [
        f"{server_plugin.MODULE}-{server_plugin.VERSION}.dist-info"
    ]


def test_a_slice_the_wrapper_cannot_place_fails_the_step():
    runner, hidden, scheduled = _runner({"a": 0.5}, {"a": 3})

    def copies(self, hidden_states, num_scheduled_tokens):  # a vLLM that copies the slice
        return _original(self, hidden_states.clone(), num_scheduled_tokens)

    with pytest.raises(RuntimeError, match="not recognised"):
        server_plugin._wrap(copies)(runner, hidden, scheduled)
    assert "compute_logits" not in runner.model.__dict__


def test_register_leaves_an_unknown_vllm_alone(monkeypatch, caplog):
    """A vLLM whose method lacks the lines the patch relies on is not patched (clawrl then
    finds the plugin inactive at start and scores per position)."""
    fake = SimpleNamespace(GPUModelRunner=type("GPUModelRunner", (), {
        "_get_prompt_logprobs_dict": lambda self, h, n: {}}))  # fmt: skip
    monkeypatch.setitem(sys.modules, "vllm", SimpleNamespace())
    monkeypatch.setitem(sys.modules, "vllm.v1", SimpleNamespace())
    monkeypatch.setitem(sys.modules, "vllm.v1.worker", SimpleNamespace())
    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu_model_runner", fake)
    before = fake.GPUModelRunner.__dict__["_get_prompt_logprobs_dict"]
    with caplog.at_level("WARNING", logger="clawrl.vllm_plugin"):
        server_plugin.register()
    assert fake.GPUModelRunner.__dict__["_get_prompt_logprobs_dict"] is before
    assert "not active" in caplog.text


class PunicaWrapperCPU:  # the names the plugin looks for
    def __init__(self, indices: list[int]) -> None:
        self._sampler_indices = torch.tensor(indices + [0] * 4)
        self.indices_len = [None, len(indices), None, None]

    @property
    def sampler_indices(self) -> torch.Tensor:
        return self._sampler_indices[: self.indices_len[1]]


class LogitsProcessorWithLoRA:
    def __init__(self, punica) -> None:
        self.punica_wrapper = punica


class _LoRAModel(_Model):
    """Logits plus a per-adapter bias, indexed like vLLM's CPU kernels: one sampler index per
    row, or one broadcast over all rows; any other count fails like ``einsum`` does."""

    def __init__(self, weight, punica, bias) -> None:
        super().__init__(weight)
        self.punica, self.bias = punica, bias

    def modules(self):
        return [self, LogitsProcessorWithLoRA(self.punica)]

    def compute_logits(self, h):
        idx = self.punica.sampler_indices
        if len(idx) not in (1, h.shape[0]):
            raise RuntimeError(f"einsum(): subscript b has size {len(idx)} ... {h.shape[0]}")
        return h @ self.weight + self.bias[idx]


def test_each_prompt_slice_gets_its_own_requests_adapter_under_lora():
    """vLLM 0.32's CPU LoRA logits kernels crash on a prompt slice when the step holds two
    requests or more; the plugin runs each slice with its own request's adapter index."""
    runner, hidden, scheduled = _runner({"a": None, "b": 0.5}, {"a": 3, "b": 4})
    bias = torch.randn(3, 7, generator=torch.Generator().manual_seed(2))
    punica = PunicaWrapperCPU([2, 1])  # request a uses adapter slot 2, b slot 1
    runner.model = _LoRAModel(runner.model.weight, punica, bias)
    with pytest.raises(RuntimeError, match="einsum"):
        _original(runner, hidden, scheduled)
    got = server_plugin._wrap(_original)(runner, hidden, scheduled)
    w = runner.model.weight
    assert torch.allclose(got["a"], torch.log_softmax(hidden[0:2] @ w + bias[2], -1))
    assert torch.allclose(got["b"], torch.log_softmax((hidden[3:6] @ w + bias[1]) / 0.5, -1))
    assert punica.sampler_indices.tolist() == [2, 1]  # restored for the step's sampling


def test_seeded_cpu_generators_of_discarded_tokens_are_put_back():
    """vLLM 0.32 rewinds the seeded generator of a request whose sampled token it discards (a
    prompt not yet wholly prefilled) with ``set_offset``, which a CPU generator does not have;
    the plugin restores the state it had before sampling instead, and leaves the others (and
    vLLM's own rewind of any generator it did not take) alone."""

    class Runner:
        def sample_tokens(self, grammar_output):
            self.drawn = {i: torch.rand(3, generator=g).tolist()
                          for i, g in self.input_batch.generators.items()}  # fmt: skip
            return self._bookkeeping_sync("out")

        def _bookkeeping_sync(self, x):  # vLLM's rewind, as it reads in 0.32
            for i in np.nonzero(self.discard_request_mask.np[: self.input_batch.num_reqs])[0]:
                gen = self.input_batch.generators.get(int(i))
                if gen is not None:
                    gen.set_offset(gen.get_offset() - 4)
            return x

    plain = Runner()
    gens = {0: torch.Generator().manual_seed(7), 1: torch.Generator().manual_seed(8)}
    plain.input_batch = SimpleNamespace(num_reqs=3, generators=gens)
    plain.discard_request_mask = SimpleNamespace(np=np.array([True, False, True]))
    plain.execute_model_state = object()
    with pytest.raises(RuntimeError, match="offset"):  # what killed the CPU engine core
        plain.sample_tokens(None)

    server_plugin._patch_seeded(Runner)
    runner = Runner()
    gens = {0: torch.Generator().manual_seed(7), 1: torch.Generator().manual_seed(8)}
    runner.input_batch = SimpleNamespace(num_reqs=3, generators=gens)
    runner.discard_request_mask = SimpleNamespace(np=np.array([True, False, True]))
    runner.execute_model_state = object()
    assert runner.sample_tokens(None) == "out"
    first = runner.drawn
    assert set(runner.input_batch.generators) == {0, 1}
    again = runner.sample_tokens(None)  # the discarded request draws the same again; 1 moved on
    assert again == "out" and runner.drawn[0] == first[0] and runner.drawn[1] != first[1]
    assert runner._clawrl_seeded == {}
