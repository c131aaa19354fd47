"""The gateway (serving/gateway) against the real Triton, called by the official clients unmodified: `deepl`
(DeepL API v2) and `libretranslatepy` (LibreTranslate), and by plain HTTP for the /v1 routes, keys, quotas,
limits and metrics. Answers are compared with the SDK's straight over gRPC: the gateway adds nothing to them."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import urllib.error
import urllib.request

import deepl
import pytest
from libretranslatepy import LibreTranslateAPI
from prometheus_client.parser import text_string_to_metric_families
from prometheus_text import metric_values

from clients import Client
from serving.gateway.keys import hash_key
from serving.gateway.service import COALESCE_IN_FLIGHT, COALESCE_ROWS, Coalescer
from serving.launcher.embedded import free_ports
from serving.launcher.gateway import Gateway, GatewayOptions

PARAGRAPH = "我爱你。今天天气很好。\n他是谁？"
KEYS = {"good": "k-good-7f3a", "quota": "k-quota-91c2", "slow": "k-slow-55d0"}


def call(url: str, body: dict | bytes | None = None, headers: dict | None = None, method: str | None = None):
    """(status, headers, JSON body) of one request, errors included."""
    data = body if isinstance(body, bytes | None) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if isinstance(body, dict):
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, error.headers, json.loads(error.read() or b"null")


@pytest.fixture(scope="module")
def sdk(triton):
    with Client(triton.grpc_url) as client:
        yield client


@pytest.fixture(scope="module")
def keyed(triton, tmp_path_factory):
    """A second gateway with keys: one unlimited, one with a 40-character quota, one with 2 requests a minute."""
    folder = tmp_path_factory.mktemp("gateway-keys")
    keys = folder / "keys.toml"
    keys.write_text(
        f'[keys.team-good]\nsha256 = "{hash_key(KEYS["good"])}"\n'
        f'[keys.team-quota]\nsha256 = "{hash_key(KEYS["quota"])}"\ncharacter_limit = 40\n'
        f'[keys.team-slow]\nsha256 = "{hash_key(KEYS["slow"])}"\nrequests_per_minute = 2\n',
        encoding="utf-8",
    )
    [port] = free_ports(1)
    options = GatewayOptions(triton_grpc=triton.grpc_url, port=port, keys_file=keys, usage_file=folder / "usage.json")
    with Gateway(options) as running:
        yield running


def translator(gateway, key: str = "any") -> deepl.Translator:
    return deepl.Translator(key, server_url=gateway.url, send_platform_info=False)


# ---- DeepL API v2, with DeepL's own client -------------------------------------------------------------------


def test_deepl_client_translates_a_string_and_a_list_as_the_sdk_does(gateway, sdk):
    client = translator(gateway)
    one = client.translate_text("我爱你。", target_lang="EN-US")
    assert one.text == sdk.translate("我爱你。")[0]
    assert one.detected_source_lang == "ZH" and one.billed_characters == len("我爱你。")
    texts = [PARAGRAPH, "这本书很有意思。"]
    many = client.translate_text(texts, source_lang="ZH", target_lang="EN-GB")
    assert [r.text for r in many] == [sdk.translate(t)[0] for t in texts]
    assert "\n" in many[0].text  # the paragraph's line break is kept


def test_deepl_split_sentences_reaches_the_model(gateway, sdk):
    client = translator(gateway)
    for mode in ("0", "nonewlines"):
        got = client.translate_text(PARAGRAPH, target_lang="EN-US", split_sentences=mode).text
        assert got == sdk.translate(PARAGRAPH, split_sentences=mode)[0]


def test_deepl_languages(gateway):
    client = translator(gateway)
    assert [lang.code for lang in client.get_source_languages()] == ["ZH"]
    assert {lang.code for lang in client.get_target_languages()} == {"EN-GB", "EN-US"}


def test_deepl_html_keeps_the_markup_and_translates_the_text(gateway, sdk):
    html = '<p class="a">我爱你。</p>\n<p><b>他是谁？</b> <script>var x = "我";</script></p>'
    got = translator(gateway).translate_text(html, target_lang="EN-US", tag_handling="html").text
    expected = (
        f'<p class="a">{sdk.translate("我爱你。")[0]}</p>\n<p><b>{sdk.translate("他是谁？")[0]}</b> '
        '<script>var x = "我";</script></p>'
    )
    assert got == expected


def test_deepl_refuses_what_it_cannot_honour_by_name(gateway):
    client = translator(gateway)
    for kwargs, named in (
        ({"formality": "more"}, "formality"),
        ({"tag_handling": "xml"}, "tag_handling"),
        ({"context": "a film review"}, "context"),
    ):
        with pytest.raises(deepl.DeepLException, match=named) as caught:
            client.translate_text("我爱你。", target_lang="EN-US", **kwargs)
        assert caught.value.http_status_code == 400
    status, _, body = call(f"{gateway.url}/v2/translate", {"text": ["我爱你。"], "target_lang": "DE"})
    assert status == 400 and "target_lang" in body["message"]


def test_deepl_errors_have_deepls_codes_and_a_message(gateway):
    url = f"{gateway.url}/v2/translate"
    status, _, body = call(url, {"text": [""], "target_lang": "EN-US"})
    assert status == 400 and "empty" in body["message"]  # Triton's own message, naming the problem
    status, _, body = call(url, {"text": ["好"] * 51, "target_lang": "EN-US"})
    assert status == 400 and "at most 50" in body["message"]
    status, _, body = call(url, {"text": ["好" * 50_000], "target_lang": "EN-US"})
    assert status == 413 and "128 KiB" in body["message"]
    status, _, body = call(url, b"{not json", {"Content-Type": "application/json"})
    assert status == 400 and "JSON" in body["message"]


def test_deepl_keys_usage_and_quota(keyed):
    with pytest.raises(deepl.AuthorizationException):
        translator(keyed, "not-a-key").translate_text("我爱你。", target_lang="EN-US")
    good = translator(keyed, KEYS["good"])
    before = good.get_usage().character.count
    good.translate_text(["我爱你。", "他是谁？"], target_lang="EN-US")
    assert good.get_usage().character.count == before + 8

    quota = translator(keyed, KEYS["quota"])
    assert quota.get_usage().character.limit == 40
    quota.translate_text("今天天气很好。" * 5, target_lang="EN-US")  # 35 of 40
    with pytest.raises(deepl.QuotaExceededException):
        quota.translate_text("今天天气很好。", target_lang="EN-US")  # 42 > 40: refused, not charged
    usage = quota.get_usage().character
    assert usage.count == 35 and usage.limit_reached is False
    quota.translate_text("我爱你。", target_lang="EN-US")  # 39 still fits


def test_a_key_over_its_rate_gets_429_with_retry_after(keyed):
    url = f"{keyed.url}/v2/languages"
    headers = {"Authorization": f"DeepL-Auth-Key {KEYS['slow']}"}
    statuses = [call(url, headers=headers)[0] for _ in range(2)]
    status, response_headers, body = call(url, headers=headers)
    assert statuses == [200, 200] and status == 429
    assert 1 <= int(response_headers["Retry-After"]) <= 30 and "2 a minute" in body["message"]
    assert call(url, headers={"Authorization": f"DeepL-Auth-Key {KEYS['good']}"})[0] == 200  # per key


def test_usage_survives_a_restart_of_the_gateway(keyed, triton):
    good = translator(keyed, KEYS["good"])
    good.translate_text("我爱你。", target_lang="EN-US")
    used = good.get_usage().character.count
    keyed.stop()  # SIGTERM: the usage file is written on the way out
    keyed.start()
    assert translator(keyed, KEYS["good"]).get_usage().character.count == used


# ---- LibreTranslate, with libretranslatepy ---------------------------------------------------------------------


def test_libretranslate_client_translates_lists_languages_and_detects(gateway, sdk):
    client = LibreTranslateAPI(gateway.url)
    assert client.translate(PARAGRAPH, "zh", "en") == sdk.translate(PARAGRAPH)[0]
    assert client.translate("我爱你。", "auto", "en") == sdk.translate("我爱你。")[0]
    assert {"code": "zh", "name": "Chinese", "targets": ["en"]} in client.languages()
    assert client.detect("我爱你。")[0] == {"language": "zh", "confidence": 100.0}
    assert client.detect("I love 北京")[0]["language"] == "en"


def test_libretranslate_json_lists_html_and_errors(gateway, sdk):
    url = f"{gateway.url}/translate"
    status, _, body = call(url, {"q": ["我爱你。", "他是谁？"], "source": "auto", "target": "en"})
    assert status == 200 and body["translatedText"] == [sdk.translate(t)[0] for t in ("我爱你。", "他是谁？")]
    assert [d["language"] for d in body["detectedLanguage"]] == ["zh", "zh"]
    status, _, body = call(url, {"q": "<i>我爱你。</i>", "source": "zh", "target": "en", "format": "html"})
    assert body["translatedText"] == f"<i>{sdk.translate('我爱你。')[0]}</i>"
    status, _, body = call(url, {"q": "我爱你。", "source": "zh", "target": "fr"})
    assert status == 400 and "target" in body["error"]


def test_libretranslate_api_key_is_checked(keyed):
    assert LibreTranslateAPI(keyed.url, api_key=KEYS["good"]).translate("我爱你。", "zh", "en")
    with pytest.raises(urllib.error.HTTPError) as caught:
        LibreTranslateAPI(keyed.url, api_key="wrong").translate("我爱你。", "zh", "en")
    assert caught.value.code == 403 and json.load(caught.value)["error"] == "invalid API key"


# ---- /v1, streams, metrics ----------------------------------------------------------------------------------


def test_v1_routes_answer_as_the_sdk_and_refuse_bad_options(gateway, sdk):
    status, _, body = call(f"{gateway.url}/v1/sentiment", {"texts": ["这部电影不差", "服务一点也不好"]})
    assert status == 200 and [r["label"] for r in body["results"]] == ["positive", "negative"]
    status, _, body = call(f"{gateway.url}/v1/summarize", {"texts": [PARAGRAPH], "mode": "extractive"})
    assert body["results"] == sdk.summarize(PARAGRAPH, mode="extractive")
    status, _, body = call(f"{gateway.url}/v1/translate", {"texts": ["我爱你。"], "num_beams": 9})
    assert status == 400 and "num_beams" in body["detail"]
    status, _, body = call(f"{gateway.url}/v1/translate", {"texts": ["我爱你。"], "num_beam": 2})
    assert status == 400 and "num_beam" in body["detail"]  # a misspelt option is refused, not ignored
    status, _, schema = call(f"{gateway.url}/openapi.json")
    assert {"/v2/translate", "/translate", "/v1/translate", "/v1/translate/stream"} <= set(schema["paths"])


def test_coalesced_requests_fail_alone(gateway):
    """Concurrent /v1/sentiment requests travel to Triton together; one with an empty text fails by itself."""
    texts = ["这部电影不差", "服务一点也不好", "", "味道不错，送得快"] * 6
    with concurrent.futures.ThreadPoolExecutor(len(texts)) as pool:
        answers = list(pool.map(lambda t: call(f"{gateway.url}/v1/sentiment", {"texts": [t]}), texts))
    for text, (status, _, body) in zip(texts, answers):
        if text:
            assert status == 200 and body["results"][0]["label"] in ("positive", "negative")
        else:
            assert status == 400 and "empty" in body["detail"]


def test_requests_of_one_loop_turn_leave_as_one_call_and_few_calls_are_in_flight():
    """The coalescer sends what arrived in one event-loop turn as one call, and never more calls at once than its
    bound: the rest wait and leave together when a call returns."""
    calls: list[list[str]] = []
    in_flight = peak = 0

    async def send(texts: list[str]) -> list[str]:
        nonlocal in_flight, peak
        calls.append(texts)
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.05)
        in_flight -= 1
        return [text.upper() for text in texts]

    async def main() -> list[list[str]]:
        coalescer = Coalescer(send)
        first = await asyncio.gather(*(coalescer.answer([f"a{i}"]) for i in range(5)))
        spread = [asyncio.ensure_future(coalescer.answer([f"b{i}"])) for i in range(100)]
        for _ in range(COALESCE_IN_FLIGHT * 3):  # arrivals over several turns while calls are out
            spread.append(asyncio.ensure_future(coalescer.answer(["c"])))
            await asyncio.sleep(0.001)
        return [*first, *await asyncio.gather(*spread)]

    answers = asyncio.run(main())
    assert answers[:5] == [[f"A{i}"] for i in range(5)] and answers[5:105] == [[f"B{i}"] for i in range(100)]
    assert calls[0] == [f"a{i}" for i in range(5)]  # one turn's requests, one call
    assert [*calls[1], *calls[2]][:100] == [f"b{i}" for i in range(100)]  # in order, at most a call's rows each
    assert len(calls[1]) == COALESCE_ROWS
    assert peak <= COALESCE_IN_FLIGHT and any(c.count("c") > 1 for c in calls)  # under load, they wait together
    assert sum(len(c) for c in calls) == 5 + 100 + COALESCE_IN_FLIGHT * 3  # every text sent once


def stream_events(url: str, body: dict) -> list[tuple[str, dict]]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    events, name = [], "message"
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        for raw in response:
            line = raw.decode().rstrip("\n")
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                events.append((name, json.loads(line[5:])))
                name = "message"
    return events


@pytest.mark.parametrize("num_beams", [1, 4])
def test_v1_stream_sends_sentences_in_order_and_joins_to_the_answer(gateway, sdk, num_beams):
    events = stream_events(f"{gateway.url}/v1/translate/stream", {"text": PARAGRAPH, "num_beams": num_beams})
    assert events[0] == ("message", {"sentences": ["我爱你。", "今天天气很好。", "他是谁？"]})
    assert events[-1] == ("done", {})
    pieces = [e for _, e in events[1:-1]]
    sentences = [e["sentence"] for e in pieces if "sentence" in e]
    assert sentences == sorted(sentences) and set(sentences) == {0, 1, 2}
    joined = "".join(e.get("text", e.get("separator", "")) for e in pieces)
    assert joined == sdk.translate(PARAGRAPH, num_beams=num_beams)[0]
    if num_beams == 1:
        assert len(sentences) > 3  # greedy: pieces of sentences, not whole sentences


def test_v1_explain_gives_the_alignment(gateway, sdk):
    status, _, body = call(f"{gateway.url}/v1/explain/translate", {"text": "我爱你。"})
    assert status == 200 and body["translation"] == sdk.translate("我爱你。")[0]
    layers = body["attention"]
    assert len(layers[-1]) == len(body["target_tokens"]) and len(layers[-1][0]) == len(body["source_tokens"])


def test_metrics_count_routes_statuses_and_key_ids_never_keys(keyed):
    translator(keyed, KEYS["good"]).translate_text("我爱你。", target_lang="EN-US")
    call(f"{keyed.url}/v2/usage", headers={"Authorization": "DeepL-Auth-Key nope"})
    call(f"{keyed.url}/no/such/path/{'x' * 20}")
    with urllib.request.urlopen(f"{keyed.url}/metrics", timeout=10) as response:
        text = response.read().decode()
    name = "ropeserve_gateway_requests_total"
    assert metric_values(text, name, key="team-good", route="/v2/translate", status="200") >= [1.0]
    assert metric_values(text, name, route="/v2/usage", status="403")
    routes = {
        sample.labels["route"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }
    assert "other" in routes and not any("no/such" in route for route in routes)  # templates, not raw paths
    assert all(key not in text for key in KEYS.values())
    assert metric_values(text, "ropeserve_gateway_characters_total", key="team-good")[0] >= 4
