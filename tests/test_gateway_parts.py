"""The gateway's parts that need no server: keys and quotas, HTML text runs, language guesses, bind rule."""

from __future__ import annotations

import asyncio
import json

import pytest

from serving.gateway.__main__ import main as gateway_main
from serving.gateway.errors import GatewayError
from serving.gateway.html_text import characters, translate_html
from serving.gateway.keys import ANONYMOUS, Account, Keys, hash_key
from serving.gateway.service import detect_language


def keys_toml(**entries: str) -> str:
    return "".join(f"[keys.{key_id}]\n{body}\n" for key_id, body in entries.items())


def test_keys_are_matched_by_hash_and_a_wrong_one_is_403():
    keys = Keys.from_toml(keys_toml(a=f'sha256 = "{hash_key("secret-a")}"'), "test")
    assert keys.authenticate("secret-a").id == "a" and not keys.open
    for presented in ("secret-b", "", None):
        with pytest.raises(GatewayError) as caught:
            keys.authenticate(presented)
        assert caught.value.status == 403


def test_no_keys_serves_everyone_as_anonymous():
    keys = Keys.from_toml("", "test")
    assert keys.open and keys.authenticate(None).id == ANONYMOUS


@pytest.mark.parametrize(
    "body, named",
    [
        ('sha256 = "abc"', "64 hex digits"),
        (f'sha256 = "{"0" * 64}"\nrequests_per_minute = 0', "requests_per_minute"),
        (f'sha256 = "{"0" * 64}"\nquota = 5', "unknown fields quota"),
    ],
)
def test_a_broken_keys_file_is_refused_by_name(body, named):
    with pytest.raises(ValueError, match=named):
        Keys.from_toml(keys_toml(a=body), "keys.toml")


def test_the_rate_bucket_refills_and_says_when():
    account = Account("a", requests_per_minute=2, refilled_at=100.0)
    account.take_request(now=100.0)
    account.take_request(now=100.0)
    with pytest.raises(GatewayError) as caught:
        account.take_request(now=100.0)
    assert caught.value.status == 429 and caught.value.retry_after_s == 30
    account.take_request(now=130.0)  # half a minute: one request back


def test_the_character_quota_refuses_what_would_pass_it():
    account = Account("a", character_limit=10, characters=8)
    account.check_characters(2)
    with pytest.raises(GatewayError) as caught:
        account.check_characters(3)
    assert caught.value.status == 456 and "8 of 10" in caught.value.message


def test_usage_is_saved_and_read_back(tmp_path):
    text = keys_toml(a=f'sha256 = "{hash_key("k")}"')
    usage = tmp_path / "usage.json"
    keys = Keys.from_toml(text, "test", usage)
    keys.charge(keys.authenticate("k"), 42)
    keys.save_usage()
    assert json.loads(usage.read_text()) == {"a": 42}
    assert Keys.from_toml(text, "test", usage).authenticate("k").characters == 42


def test_html_keeps_markup_and_translates_each_text_run():
    async def upper(texts):
        return [t.upper() + "!" for t in texts]

    html = '<p title="我">ab <b>c&amp;d</b></p><script>var s = "x";</script><!-- note -->\n'
    out = asyncio.run(translate_html(html, upper))
    assert out == '<p title="我">AB! <b>C&amp;D!</b></p><script>var s = "x";</script><!-- note -->\n'
    assert characters(html) == len("ab ") + len("c&d") + len("\n")


def test_language_guess_by_share_of_letters():
    assert detect_language("我爱你。")[0] == {"language": "zh", "confidence": 100.0}
    guesses = detect_language("I love 北京")
    assert [g["language"] for g in guesses] == ["en", "zh"]
    assert detect_language("123 !!")[0]["language"] == "zh"  # nothing to go by: the one source language


def test_no_keys_on_a_public_address_is_refused(capsys, monkeypatch):
    monkeypatch.delenv("ROPESERVE_GATEWAY_KEYS", raising=False)
    monkeypatch.delenv("ROPESERVE_GATEWAY_OPEN_WITHOUT_KEYS", raising=False)
    assert gateway_main(["--host", "0.0.0.0", "--port", "1"]) == 2
    assert "without API keys" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("translator", "named"),
    [("sentiment", "answers LABEL, not TRANSLATION"), ("summarize", "answers SUMMARY"), ("nope", "task must be")],
)
def test_a_translator_that_is_no_translator_is_refused_at_start(capsys, monkeypatch, translator, named):
    monkeypatch.delenv("ROPESERVE_GATEWAY_KEYS", raising=False)
    assert gateway_main(["--port", "1", "--translator", translator]) == 2
    assert f"--translator {translator}:" in (err := capsys.readouterr().err) and named in err
