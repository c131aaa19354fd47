"""`translate_explain` and `sentiment_explain` end to end on the real tritonserver: the same answers as the
fast endpoints, attention rows that are distributions, the SDK (sync, asyncio, gRPC, HTTP), the CLI's
heatmap PNG, and errors like the other endpoints'."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from PIL import Image

from clients import AsyncClient, Client, ClientError, SentimentAttention, TranslationAlignment
from clients.cli import EXIT_OK, EXIT_REQUEST_FAILED, EXIT_USAGE, main
from clients.heatmap import HeatmapUnavailable, figure_pixels, find_cjk_font, render_heatmap

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = ["我爱你。", "这本书很有意思。", "他休息两天。", "今天天气很好。"]
REVIEWS = ["这部电影不差", "服务一点也不好", "菜很好吃，下次还来。"]
ROW_TOLERANCE = 1e-4


@pytest.fixture(params=["grpc", "http"])
def client(request, triton):
    url = triton.grpc_url if request.param == "grpc" else triton.http_address
    with Client(url, protocol=request.param) as c:
        yield c


def assert_rows_are_distributions(attention: np.ndarray) -> None:
    assert np.all(attention >= 0)
    assert np.abs(attention.sum(axis=-1) - 1.0).max() <= ROW_TOLERANCE


@pytest.mark.parametrize("beams", [1, 4])
def test_translation_equals_the_fast_endpoint(client, beams):
    explained = client.explain("translate", SENTENCES, num_beams=beams)
    assert [e.translation for e in explained] == client.translate(SENTENCES, num_beams=beams)
    for text in SENTENCES[:2]:  # alone, as in a batch
        (alone,) = client.explain("translate", text, num_beams=beams)
        assert alone.translation == client.translate(text, num_beams=beams)[0]


def test_alignment_shapes_and_rows(client):
    for result in client.explain("translate", SENTENCES):  # one request of four different lengths
        assert isinstance(result, TranslationAlignment)
        layers, targets, sources = result.attention.shape
        assert layers == 3 and targets == len(result.target_tokens) and sources == len(result.source_tokens)
        assert result.source_tokens[-1] == "[EOS]" and result.target_tokens[-1] == "[EOS]"
        assert_rows_are_distributions(result.attention)


def test_i_love_you_aligns_love_with_ai(client):
    """The seed's example: "love" attends to 爱 most (last decoder layer)."""
    (result,) = client.explain("translate", "我爱你。")
    assert result.translation == "I love you."
    assert result.source_tokens == ["我", "爱", "你", "。", "[EOS]"]
    assert result.target_tokens == ["I", "love", "you", ".", "[EOS]"]
    assert dict(result.strongest_sources())["love"] == "爱"


def test_a_translation_cut_by_max_new_tokens_has_no_eos_row(client):
    (result,) = client.explain("translate", "这本书很有意思。", max_new_tokens=2)
    assert result.translation == client.translate("这本书很有意思。", max_new_tokens=2)[0]
    assert len(result.target_tokens) == 2 and "[EOS]" not in result.target_tokens
    assert result.attention.shape[1] == 2


def test_sentiment_explain_equals_sentiment(client):
    explained = client.explain("sentiment", REVIEWS)
    fast = client.sentiment(REVIEWS)
    for e, f in zip(explained, fast, strict=True):
        assert isinstance(e, SentimentAttention)
        assert e.label == f.label and abs(e.score - f.score) <= 1e-6
        n = len(e.tokens)
        assert n >= 1 and e.attention.shape == (3, n, n) and e.rollout.shape == (n,)
        assert_rows_are_distributions(e.attention)
        assert abs(float(e.rollout.sum()) - 1.0) <= ROW_TOLERANCE
    assert explained[0].label == "positive" and explained[1].label == "negative"


def test_async_client(triton):
    async def run() -> tuple[list, list]:
        async with AsyncClient(triton.grpc_url) as c:
            return await asyncio.gather(c.explain("translate", "我爱你。"), c.explain("sentiment", "这部电影不差"))

    (translation,), (sentiment,) = asyncio.run(run())
    assert translation.translation == "I love you." and sentiment.label == "positive"


@pytest.mark.parametrize(
    "task,texts,options,message",
    [
        ("translate", [""], {}, r"TEXT\[0\] is empty"),
        ("sentiment", ["好", "\x00\x01"], {}, r"TEXT\[1\] is empty, whitespace-only or holds only control characters"),
        ("translate", ["我爱你。"], {"num_beams": 9}, "NUM_BEAMS must be between 1 and 8, got 9"),
        ("translate", ["我爱你。"], {"max_new_tokens": 0}, "MAX_NEW_TOKENS must be between 1 and 96, got 0"),
        ("translate", ["我爱你。", "你好。再见。"], {}, r"TEXT\[1\] holds 2 sentences; translate_explain explains one"),
    ],
)
def test_bad_input_names_the_problem(client, task, texts, options, message):
    with pytest.raises(ClientError, match=message) as caught:
        client.explain(task, texts, **options)
    assert caught.value.status in ("StatusCode.INVALID_ARGUMENT", "400")


def test_a_paragraph_is_explained_read_whole_only_when_asked(client):
    (explained,) = client.explain("translate", ["你好。再见。"], split_sentences="0", num_beams=1)
    assert explained.translation == client.translate("你好。再见。", split_sentences="0", num_beams=1)[0]


def test_sdk_refuses_options_sentiment_does_not_take(client):
    with pytest.raises(TypeError, match="sentiment_explain does not take num_beams"):
        client.explain("sentiment", "好", num_beams=2)
    with pytest.raises(ValueError, match="explain is available for translate and sentiment"):
        client.explain("summarize", "好")


def test_cli_writes_the_translation_heatmap(triton, tmp_path, capsys):
    png = tmp_path / "alignment.png"
    code = main(["--url", triton.grpc_url, "explain", "translate", "我爱你。", "--png", str(png)])
    out, err = capsys.readouterr()
    assert code == EXIT_OK, err
    assert out.startswith("I love you.\t") and "love←爱" in out and len(out.splitlines()) == 1
    assert f"wrote {png}" in err
    image = Image.open(png)
    assert image.format == "PNG"
    assert image.size == figure_pixels(5, 5) == (450, 400)  # 5 target × 5 source tokens
    assert np.asarray(image.convert("L")).std() > 10  # a picture, not a blank page


def test_cli_sentiment_heatmaps_one_file_per_text(triton, tmp_path, capsys):
    png = tmp_path / "attention.png"
    args = ["--url", triton.grpc_url, "explain", "sentiment", "这部电影不差", "服务一点也不好", "--png", str(png)]
    assert main([*args, "--layer", "0"]) == EXIT_OK
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("positive\t") and out[1].startswith("negative\t")
    for name in ("attention-1.png", "attention-2.png"):
        assert Image.open(tmp_path / name).size[0] >= figure_pixels(1, 1)[0]


def test_cli_errors(triton, tmp_path, capsys):
    base = ["--url", triton.grpc_url, "explain"]
    assert main([*base, "translate", "我爱你。", "--layer", "7", "--png", str(tmp_path / "x.png")]) == EXIT_USAGE
    assert "--layer 7: the model has 3 layers" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()
    assert main([*base, "translate", "  "]) == EXIT_REQUEST_FAILED
    assert "TEXT[0] is empty" in capsys.readouterr().err


@pytest.mark.parametrize(
    "model,feeds,output",
    [
        (
            "translate_attention",
            {
                "input_ids": np.array([[61, 45, 78, 9, 3, 0], [61, 45, 78, 9, 12, 3]], np.int32),
                "attention_mask": np.array([[1, 1, 1, 1, 1, 0], [1] * 6], np.int32),
                "decoder_input_ids": np.array([[2, 40, 41, 0], [2, 40, 41, 42]], np.int32),
            },
            "cross_attention",
        ),
        (
            "sentiment_attention",
            {
                "input_ids": np.array([[120, 130, 140, 0], [5, 6, 7, 8]]),
                "attention_mask": np.array([[1, 1, 1, 0], [1] * 4]),
            },
            "attention",
        ),
    ],
)
def test_built_explain_models_load_in_ngc_onnxruntime(model, feeds, output, ngc_ort):
    path = ROOT / "model_repository" / model / "1" / "model.onnx"
    assert path.exists(), f"{path} is missing: run `make repository`"
    (got,) = ngc_ort(path, feeds, [output])
    (want,) = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run([output], feeds)
    assert np.abs(got - want).max() <= 1e-5
    assert_rows_are_distributions(want[1])  # the unpadded text


def test_without_a_cjk_font_png_fails_before_any_request(monkeypatch, tmp_path, capsys):
    from matplotlib import font_manager

    monkeypatch.setitem(sys.modules, "pylopdf_fonts_zh_cn", None)  # the bundled font is not installed
    monkeypatch.setattr(font_manager.fontManager, "ttflist", [])  # nor any system font
    with pytest.raises(HeatmapUnavailable, match="no font with Chinese characters"):
        find_cjk_font()
    png = tmp_path / "x.png"
    # nothing listens on port 1: reaching the server would exit with EXIT_UNREACHABLE instead
    assert main(["--url", "127.0.0.1:1", "explain", "translate", "我爱你。", "--png", str(png)]) == EXIT_USAGE
    assert "pip install -e '.[explain]'" in capsys.readouterr().err and not png.exists()


def test_heatmap_labels_must_fit_the_matrix(tmp_path):
    with pytest.raises(ValueError, match=r"does not fit 2 × 3 labels"):
        render_heatmap(np.eye(3), ["a", "b"], ["x", "y", "z"], tmp_path / "m.png")
