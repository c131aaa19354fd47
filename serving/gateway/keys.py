"""API keys, per-key rate and character quotas, and usage.

Keys are stored as their SHA-256, never in the clear (``python -m serving.gateway --hash-key`` prints it), in a
TOML file or the same TOML in an environment variable (a container secret)::

    [keys.team-a]                  # the key's id: what metrics and logs show, never the key
    sha256 = "9f86d081884c7d65..."
    requests_per_minute = 600      # optional: a token bucket of this size, refilled at this rate
    character_limit = 1_000_000    # optional: source characters translated, summed over the usage file's life

With no keys configured every request is served as the key ``anonymous``, and the gateway refuses to bind anything
but loopback (as Triton's own ports): an open port without keys must be asked for.

Over the rate a request gets 429 with ``Retry-After``; once the characters are spent, 456 (DeepL's "quota
exceeded"). Usage lives in memory and, with a usage file, survives restarts (written at most once a second).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .errors import QUOTA_EXCEEDED, GatewayError

ANONYMOUS = "anonymous"
UNLIMITED_CHARACTERS = 10**12  # what /v2/usage reports for a key without a limit (DeepL's clients want a number)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


@dataclass
class Account:
    """One key's limits and what it has used."""

    id: str
    requests_per_minute: float | None = None
    character_limit: int | None = None
    characters: int = 0
    tokens: float = field(default=0.0, repr=False)  # the rate bucket's content
    refilled_at: float = field(default_factory=time.monotonic, repr=False)

    def __post_init__(self) -> None:
        self.tokens = float(self.requests_per_minute or 0)

    def take_request(self, now: float) -> None:
        """Spend one request from the bucket, or refuse with the wait until the next one."""
        if self.requests_per_minute is None:
            return
        rate_per_s = self.requests_per_minute / 60
        self.tokens = min(self.requests_per_minute, self.tokens + max(0.0, now - self.refilled_at) * rate_per_s)
        self.refilled_at = now
        if self.tokens < 1:
            wait_s = math.ceil((1 - self.tokens) / rate_per_s)
            raise GatewayError(
                429,
                f"too many requests for key {self.id!r}: at most "
                f"{self.requests_per_minute:g} a minute; retry in {wait_s} s",
                wait_s,
            )
        self.tokens -= 1

    def check_characters(self, characters: int) -> None:
        if self.character_limit is not None and self.characters + characters > self.character_limit:
            raise GatewayError(
                QUOTA_EXCEEDED,
                f"character quota of key {self.id!r} exceeded: {self.characters} of {self.character_limit} used, "
                f"this request has {characters}",
            )


class Keys:
    """Who may call, and what each caller has used. Thread-safe; the event loop and the usage writer share it."""

    def __init__(self, accounts: dict[str, Account], usage_file: Path | None = None) -> None:
        self._by_hash = accounts  # sha256 -> account
        self._anonymous = Account(ANONYMOUS) if not accounts else None
        self._lock = threading.Lock()
        self.usage_file = usage_file
        self._dirty = False
        if usage_file is not None and usage_file.exists():
            self._load_usage(usage_file)

    @property
    def open(self) -> bool:
        """No keys configured: every request is served anonymously."""
        return self._anonymous is not None

    @classmethod
    def from_toml(cls, text: str, source: str, usage_file: Path | None = None) -> Keys:
        try:
            table = tomllib.loads(text).get("keys", {})
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"{source}: not valid TOML: {error}") from None
        accounts: dict[str, Account] = {}
        for key_id, entry in table.items():
            digest = str(entry.get("sha256", "")).lower()
            if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
                raise ValueError(
                    f"{source}: keys.{key_id}.sha256 must be 64 hex digits (python -m serving.gateway "
                    "--hash-key prints it)"
                )
            unknown = set(entry) - {"sha256", "requests_per_minute", "character_limit"}
            if unknown:
                raise ValueError(f"{source}: keys.{key_id} has unknown fields {', '.join(sorted(unknown))}")
            rate, limit = entry.get("requests_per_minute"), entry.get("character_limit")
            if rate is not None and not rate > 0 or limit is not None and not limit >= 0:
                raise ValueError(f"{source}: keys.{key_id}: requests_per_minute must be > 0, character_limit >= 0")
            accounts[digest] = Account(key_id, rate, limit)
        return cls(accounts, usage_file)

    @classmethod
    def configured(cls, keys_file: Path | None, usage_file: Path | None = None) -> Keys:
        """From ``keys_file``, else from ``$ROPESERVE_GATEWAY_KEYS`` (the TOML itself), else none (open)."""
        if keys_file is not None:
            return cls.from_toml(keys_file.read_text(encoding="utf-8"), str(keys_file), usage_file)
        inline = os.environ.get("ROPESERVE_GATEWAY_KEYS", "")
        return cls.from_toml(inline, "$ROPESERVE_GATEWAY_KEYS", usage_file)

    def authenticate(self, presented: str | None) -> Account:
        if self._anonymous is not None:
            return self._anonymous
        if not presented:
            raise GatewayError(
                403,
                "an API key is required (Authorization: DeepL-Auth-Key <key>, Authorization: Bearer <key>, or api_key)",
            )
        account = self._by_hash.get(hash_key(presented))
        if account is None:
            raise GatewayError(403, "invalid API key")
        return account

    def take_request(self, account: Account) -> None:
        """Count one request against the key's rate (429 when over it)."""
        with self._lock:
            account.take_request(time.monotonic())

    def check_characters(self, account: Account, characters: int) -> None:
        """456 when `characters` more would pass the key's quota; nothing is charged until the answer is ready."""
        with self._lock:
            account.check_characters(characters)

    def charge(self, account: Account, characters: int) -> None:
        with self._lock:
            account.characters += characters
            self._dirty = characters > 0 or self._dirty

    def accounts(self) -> list[Account]:
        return [self._anonymous] if self._anonymous is not None else list(self._by_hash.values())

    def save_usage(self) -> None:
        """Write the usage file if anything changed (atomically: a crash leaves the old or the new file)."""
        if self.usage_file is None or not self._dirty:
            return
        with self._lock:
            usage = {account.id: account.characters for account in self.accounts()}
            self._dirty = False
        partial = self.usage_file.with_suffix(".partial")
        partial.write_text(json.dumps(usage, indent=1), encoding="utf-8")
        partial.replace(self.usage_file)

    def _load_usage(self, path: Path) -> None:
        usage = json.loads(path.read_text(encoding="utf-8"))
        for account in self.accounts():
            account.characters = int(usage.get(account.id, 0))
