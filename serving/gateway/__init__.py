"""The gateway: DeepL's and LibreTranslate's APIs, plain JSON routes and a page to try it, beside Triton.

Apps that translate today (Mastodon, Discourse, Weblate, Nextcloud, browser extensions) speak DeepL's API or
LibreTranslate's, and their official clients take a server address; people meet a translator through a page.
Triton speaks neither and has no keys, so this process sits beside it (127.0.0.1:5000, LibreTranslate's port):
an ASGI app on uvicorn that calls Triton over gRPC with the SDK's `AsyncClient`, adds API keys with per-key rate
and character quotas, and exports per-route Prometheus metrics. It holds no model: everything it answers comes
from Triton, so it scales and restarts on its own.

- :mod:`.deepl`: DeepL API v2 (``/v2/translate``, ``/v2/languages``, ``/v2/usage``);
- :mod:`.libre`: LibreTranslate (``/translate``, ``/languages``, ``/detect``);
- :mod:`.plain`: ``/v1/<task>`` for every task, ``/v1/<task>/stream`` (server-sent events), ``/v1/explain``;
- :mod:`.keys`: keys (stored hashed), quotas, usage; :mod:`.metrics`; :mod:`.app` puts them together.
"""
