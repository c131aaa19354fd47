"""Drain the front models before Triton stops, so the requests they hold still reach the ONNX models.

On SIGTERM Triton 2.51 marks itself not ready and refuses every new inference request, BLS calls included. A
request that a front model had already accepted, but not yet passed on to its ONNX model, then fails with
``translate_generator: ... Server not ready`` (measured: 1 of 4 in-flight requests under load). Unloading the front
models first avoids that: Triton stops routing new requests to them, lets them finish every request they hold
(their BLS calls still succeed, the server is still up), and only then does SIGTERM stop the rest.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

FRONT_BACKEND = "python"


def _post(url: str, headers: dict[str, str], body: dict | None = None, timeout_s: float = 10) -> object:
    request = urllib.request.Request(
        url, data=json.dumps(body or {}).encode(), headers={"Content-Type": "application/json", **headers}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        payload = response.read()
    return json.loads(payload) if payload else None


def front_models(http_url: str, headers: dict[str, str]) -> list[str]:
    """Loaded models that run on the Python backend (they call the others; nothing calls them)."""
    index = _post(f"{http_url}/v2/repository/index", headers, {"ready": True})
    names = []
    for entry in index or []:
        with urllib.request.urlopen(f"{http_url}/v2/models/{entry['name']}/config", timeout=10) as response:
            if json.loads(response.read()).get("backend") == FRONT_BACKEND:
                names.append(entry["name"])
    return names


def drain_front_models(http_url: str, headers: dict[str, str], timeout_s: float) -> list[str]:
    """Unload the front models and wait (up to ``timeout_s``) until they are gone. Returns their names.

    Best effort: a server that does not answer is left to SIGTERM.
    """
    try:
        names = front_models(http_url, headers)
        for name in names:
            _post(f"{http_url}/v2/repository/models/{name}/unload", headers)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            index = _post(f"{http_url}/v2/repository/index", headers)
            if not any(e["name"] in names and e.get("state") in ("READY", "UNLOADING") for e in index or []):
                break
            time.sleep(0.1)
        return names
    except (urllib.error.URLError, OSError, ValueError, KeyError):
        return []
