"""OpenAI-compatible serving of the policy on the engine's continuous batching (`artmlx serve`)."""

from __future__ import annotations

import threading


def run_server(server, host: str = "127.0.0.1", port: int = 8000, api_key: str = "",
               ready: threading.Event | None = None):
    """Serve `server` (a ModelServer) over HTTP with uvicorn until interrupted; returns the uvicorn server
    object when `ready` is given (it is then started on a thread and `ready` is set once it listens)."""
    import uvicorn

    from .openai_api import Api

    config = uvicorn.Config(Api(server, api_key).app(), host=host, port=port, log_level="warning")
    http = uvicorn.Server(config)
    if ready is None:
        http.run()
        return http

    def serve():
        http.run()

    thread = threading.Thread(target=serve, name="http", daemon=True)
    thread.start()
    while not http.started and thread.is_alive():
        threading.Event().wait(0.05)
    ready.set()
    http.thread = thread
    return http
