"""``flint serve``: an OpenAI-compatible HTTP server over one loaded model.

``create_app(ServerConfig(...), LLMBackend(flint.LLM(...)))`` gives the ASGI app;
docs/server.md lists the endpoints, fields, errors and extensions.
"""

from flint.server.app import create_app
from flint.server.backend import Backend, LLMBackend
from flint.server.state import ServerConfig

__all__ = ["Backend", "LLMBackend", "ServerConfig", "create_app"]
