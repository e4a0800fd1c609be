"""The OpenAI-compatible HTTP layer: ``create_app`` builds the Quart app, ``serve_http`` serves it."""

from asyncdp.api.app import create_app, set_draining
from asyncdp.api.serve import serve_http

__all__ = ["create_app", "serve_http", "set_draining"]
