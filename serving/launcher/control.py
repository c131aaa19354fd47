"""Triton's HTTP API as the launcher uses it: health, model configs, the repository index, load and unload.

The repository API is locked with the launcher's key (:meth:`serving.launcher.embedded.EmbeddedTriton.control_headers`);
callers pass those headers. Used by the launcher, the stub watchdog and the drain on stop.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def http_status(url: str, timeout_s: float = 2) -> int | None:
    """HTTP status of a GET, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


def post_json(url: str, headers: dict[str, str], body: dict | None = None, timeout_s: float = 10) -> object:
    """POST a JSON body; the decoded JSON answer (None when empty). Raises OSError (URLError) on failure."""
    request = urllib.request.Request(
        url, data=json.dumps(body or {}).encode(), headers={"Content-Type": "application/json", **headers}
    )
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        payload = response.read()
    return json.loads(payload) if payload else None


def model_config(http_url: str, model: str) -> dict:
    with urllib.request.urlopen(f"{http_url}/v2/models/{model}/config", timeout=10) as response:
        return json.loads(response.read())


def repository_index(http_url: str, headers: dict[str, str], ready_only: bool = False) -> list[dict]:
    """Every model of the repository: name, version, state (READY, UNAVAILABLE, …) and reason."""
    return post_json(f"{http_url}/v2/repository/index", headers, {"ready": True} if ready_only else None) or []


def load_model(http_url: str, headers: dict[str, str], model: str, config: dict | None = None) -> None:
    """Load (or, with a changed ``config``, reload) a model; returns when Triton has finished."""
    body = {"parameters": {"config": json.dumps(config)}} if config is not None else None
    post_json(f"{http_url}/v2/repository/models/{model}/load", headers, body, timeout_s=120)


def unload_model(http_url: str, headers: dict[str, str], model: str) -> None:
    post_json(f"{http_url}/v2/repository/models/{model}/unload", headers)
