"""Drain the front models before Triton stops, so the requests they hold still reach the ONNX models.

On SIGTERM Triton 2.51 marks itself not ready and refuses every new inference request, BLS calls included. A
request that a front model had already accepted, but not yet passed on to its ONNX model, then fails with
``translate_generator: ... Server not ready`` (measured: 1 of 4 in-flight requests under load). Unloading the front
models first avoids that: Triton stops routing new requests to them, lets them finish every request they hold
(their BLS calls still succeed, the server is still up), and only then does SIGTERM stop the rest.
"""

from __future__ import annotations

import time

from .control import model_config, repository_index, unload_model

FRONT_BACKEND = "python"


def front_models(http_url: str, headers: dict[str, str]) -> list[str]:
    """Loaded models that run on the Python backend (they call the others; nothing calls them)."""
    names = [entry["name"] for entry in repository_index(http_url, headers, ready_only=True)]
    return [name for name in names if model_config(http_url, name).get("backend") == FRONT_BACKEND]


def drain_front_models(http_url: str, headers: dict[str, str], timeout_s: float) -> list[str]:
    """Unload the front models and wait (up to ``timeout_s``) until they are gone. Returns their names.

    Best effort: a server that does not answer is left to SIGTERM.
    """
    try:
        names = front_models(http_url, headers)
        for name in names:
            unload_model(http_url, headers, name)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            index = repository_index(http_url, headers)
            if not any(e["name"] in names and e.get("state") in ("READY", "UNLOADING") for e in index):
                break
            time.sleep(0.1)
        return names
    except (OSError, ValueError, KeyError):  # URLError is an OSError
        return []
