"""The vLLM engine backend: the policy served by vLLM servers over HTTP, in token ids.

* :class:`VLLMEngine` — the :class:`clawrl.engine.Engine` over one or more vLLM servers
  (``clawrl serve --engine vllm --vllm-url URL``), with live LoRA / full-weight policy versions;
* :class:`VLLMServer` — a vLLM server clawrl launches and stops itself (no ``--vllm-url``);
* :mod:`~clawrl.engine.vllm.checks` — what a server must be before clawrl uses it (processed
  log-probs, the policy's tokenizer);
* :mod:`~clawrl.engine.vllm.protocol` — request bodies and response parsing.

Importing this package needs only ``httpx``; vLLM itself runs in its own environment.
"""

from clawrl.engine.vllm.engine import VLLMEngine
from clawrl.engine.vllm.server import VLLMServer, default_vllm_python

__all__ = ["VLLMEngine", "VLLMServer", "default_vllm_python"]
