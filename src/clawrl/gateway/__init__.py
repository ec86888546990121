"""The gateway: an OpenAI-compatible ASGI app that serves the policy and records every call.

``create_app(engine, tokenizer, store, model_name=...)`` builds it; ``clawrl serve`` runs it
with uvicorn. See :mod:`clawrl.gateway.app` for the module map, :mod:`.schemas` for what each
request field does, :mod:`.attribution` for sessions and :mod:`.splice` for exact ids across
turns.
"""

from clawrl.gateway.app import create_app
from clawrl.gateway.state import GatewayState

__all__ = ["GatewayState", "create_app"]
