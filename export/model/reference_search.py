"""Reference generation in PyTorch: greedy and beam search over the `Seq2Seq` KV cache.

These are the ground truth for the exported generator (`export/graphs/seq2seq_export.py`), so they follow
ONNX Runtime's `com.microsoft.BeamSearch` (model_type=1, CPU) step by step rather than Hugging Face:

- Decoding starts from bos; every step scores `log_softmax(logits) + beam score`, flattened over
  [num_beams × vocab], and keeps the top 2·num_beams candidates (sorted).
- At the first step only beam 0 is live (the other beams start at -1e9), so the beams differ.
- Candidates are walked best first: an eos among the first num_beams candidates closes that beam's
  sequence (without the eos) as a hypothesis scored `sum_logprobs / len ** length_penalty`, where
  len counts bos and the generated tokens before eos; other candidates refill the beams.
- A source is done once it has num_beams hypotheses and, with early_stopping, immediately; without
  it, when the best candidate score / cur_len ** length_penalty cannot beat the worst hypothesis.
  (ORT reads that best candidate from a window of the flattened top-k scores that is offset by
  `batch * num_beams` instead of `batch * 2 * num_beams`; it is reproduced, which is why the default
  here and in the export is early_stopping=True: then every row is independent of its batch.)
- After max_new_tokens steps, sources that are not done add their live beams as hypotheses.
- The best hypothesis is returned without bos and eos.

Greedy is the same procedure with one beam and early stopping, i.e. argmax until eos.

With no_repeat_ngram_size = n > 0, both follow ORT's NoRepeatNGramLogitsProcessor: after the
log_softmax and before the beam score is added, every token that would complete an n-gram already
in that row's sequence (bos included) gets the lowest float.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
import torch.nn.functional as F
from torch import Tensor

from export.model.transformer import KVCache, Seq2Seq
from serving.engine.hypotheses import Hypotheses, repeated_ngram_tokens

INITIAL_BEAM_SCORE = -1e9  # beams 1..k-1 at the first step (ORT: InitBeamState)


@dataclass(frozen=True)
class ReferenceSearch:
    """The decoding settings a checkpoint fixes (config.json), the generator bakes in, and the
    reference applies: the beam length penalty and ORT's no_repeat_ngram_size (0 = off)."""

    length_penalty: float = 1.0
    no_repeat_ngram_size: int = 0

    @classmethod
    def from_config(cls, config: dict) -> ReferenceSearch:
        """The settings a checkpoint's config.json stores (`asdict` writes them); missing keys keep the defaults."""
        return cls(**{f.name: config[f.name] for f in fields(cls) if f.name in config})

    def generate(self, model: Seq2Seq, src_ids: Tensor, src_mask: Tensor, max_new_tokens: int, num_beams: int):
        """Greedy (num_beams = 1) or beam search with these settings."""
        if num_beams == 1:
            return greedy(model, src_ids, src_mask, max_new_tokens, self.no_repeat_ngram_size)
        return beam_search(
            model,
            src_ids,
            src_mask,
            max_new_tokens,
            num_beams,
            self.length_penalty,
            no_repeat_ngram_size=self.no_repeat_ngram_size,
        )


DEFAULT_SEARCH = ReferenceSearch()


def block_repeated_ngrams(scores: Tensor, sequences: list[list[int]], n: int) -> Tensor:
    """In place on scores [rows, V]: the tokens that would repeat an n-gram of their row's sequence
    get the lowest float (n = 0: nothing is blocked)."""
    if n <= 0:
        return scores
    lowest = torch.finfo(scores.dtype).min
    for row, seq in enumerate(sequences):
        banned = repeated_ngram_tokens(seq, n)
        if banned:
            scores[row, banned] = lowest
    return scores


@torch.no_grad()
def greedy(
    model: Seq2Seq, src_ids: Tensor, src_mask: Tensor, max_new_tokens: int, no_repeat_ngram_size: int = 0
) -> list[list[int]]:
    """Argmax decoding: src_ids/src_mask [B, S] → B token lists (no bos, no eos), batched with a KV cache.

    Finished rows leave the batch, so a long straggler does not make the others pay.
    """
    model.eval()
    cfg = model.cfg
    memory = model.encode(src_ids, src_mask)  # [B, S, D]
    mask = src_mask
    out: list[list[int]] = [[] for _ in range(src_ids.shape[0])]
    alive = list(range(src_ids.shape[0]))  # batch index of each live row
    tokens = torch.full((len(alive), 1), cfg.bos_id, dtype=torch.long)
    cache = KVCache()
    for _ in range(max_new_tokens):
        logits = model.decode(tokens, memory, mask, cache, src_ids)[:, -1].float()  # [A, V]
        if no_repeat_ngram_size:  # blocking logits or log-probabilities picks the same argmax
            block_repeated_ngrams(logits, [[cfg.bos_id, *out[b]] for b in alive], no_repeat_ngram_size)
        next_tokens = logits.argmax(-1).tolist()  # [A]
        keep = []
        for row, (b, token) in enumerate(zip(alive, next_tokens, strict=True)):
            if token != cfg.eos_id:
                out[b].append(token)
                keep.append(row)
        if not keep:
            break
        if len(keep) < len(alive):
            rows = torch.tensor(keep)
            memory, mask = memory[rows], mask[rows]
            cache.reorder(rows)
            alive = [alive[r] for r in keep]
        tokens = torch.tensor([out[b][-1] for b in alive]).unsqueeze(1)  # [A, 1]
    return out


@torch.no_grad()
def beam_search(
    model: Seq2Seq,
    src_ids: Tensor,
    src_mask: Tensor,
    max_new_tokens: int,
    num_beams: int,
    length_penalty: float = 1.0,
    early_stopping: bool = True,
    no_repeat_ngram_size: int = 0,
) -> list[list[int]]:
    """Beam search as ORT's BeamSearch op does it (see the module docstring): B token lists, no bos/eos.

    With early_stopping, finished sources leave the batch. Without it they stay, feeding pad tokens
    with score 0 from row 0's self-attention cache, exactly as ORT does, because ORT's stopping test
    reads their scores.
    """
    model.eval()
    cfg = model.cfg
    batch, k, vocab = src_ids.shape[0], num_beams, cfg.target_vocab_size
    memory = model.encode(src_ids, src_mask)
    rows = torch.arange(batch).repeat_interleave(k)  # beam-major expansion: row = b * k + beam
    memory, mask = memory[rows], src_mask[rows]
    sequences = torch.full((batch * k, 1), cfg.bos_id, dtype=torch.long)  # [rows, cur_len], bos first
    beam_scores = torch.zeros(batch, k)
    beam_scores[:, 1:] = INITIAL_BEAM_SCORE
    beam_scores = beam_scores.view(-1)  # [rows]
    hyps = [Hypotheses(k, length_penalty) for _ in range(batch)]
    alive = list(range(batch))  # sources in the tensors; source alive[i] owns rows i*k .. i*k+k-1
    cache = KVCache()
    src_ids = src_ids[rows]  # used once, when the cache projects the memory
    for _ in range(max_new_tokens):
        logits = model.decode(sequences[:, -1:], memory, mask, cache, src_ids)[:, -1].float()  # [rows, V]
        log_probs = F.log_softmax(logits, dim=-1)
        if no_repeat_ngram_size:
            block_repeated_ngrams(log_probs, sequences.tolist(), no_repeat_ngram_size)
        scores = log_probs + beam_scores[:, None]
        top_scores, top_index = scores.view(len(alive), k * vocab).topk(2 * k, dim=1)  # [A, 2k], sorted
        flat_scores, top_index = top_scores.flatten().tolist(), top_index.tolist()
        cur_len = sequences.shape[1]
        chosen: list[tuple[int, int, float]] = []  # (row, token, score) of the next beams
        kept = []  # positions i in `alive` that stay in the tensors
        for i, b in enumerate(alive):
            if hyps[b].done:  # only without early stopping: pad along, as ORT does
                chosen += [(0, cfg.pad_id, 0.0)] * k
                kept.append(i)
                continue
            beams = []
            for j in range(2 * k):
                index, score = top_index[i][j], flat_scores[i * 2 * k + j]
                row, token = i * k + index // vocab, index % vocab
                if token != cfg.eos_id:
                    beams.append((row, token, score))
                elif j < k:
                    hyps[b].add(sequences[row].tolist(), score)
                if len(beams) == k:
                    break
            if hyps[b].full():
                if early_stopping:
                    hyps[b].done = True
                else:
                    window = flat_scores[i * k : i * k + 2 * k]  # ORT's window, see module docstring
                    hyps[b].done = hyps[b].items[-1][0] >= hyps[b].score(max(window), cur_len)
            if not (early_stopping and hyps[b].done):
                chosen += beams
                kept.append(i)
        if all(h.done for h in hyps):
            alive = []
            break
        pick = torch.tensor([row for row, _, _ in chosen])
        sequences = torch.cat([sequences[pick], torch.tensor([[t] for _, t, _ in chosen])], dim=1)
        beam_scores = torch.tensor([s for _, _, s in chosen], dtype=torch.float32)
        cache.reorder(pick, cross=False)
        if len(kept) < len(alive):  # early stopping: finished sources leave the batch
            source_rows = torch.tensor([i * k + beam for i in kept for beam in range(k)])
            memory, mask = memory[source_rows], mask[source_rows]
            cache.cross_kv = [(ck[source_rows], cv[source_rows]) for ck, cv in cache.cross_kv]
            alive = [alive[i] for i in kept]
    for i, b in enumerate(alive):  # out of steps: the live beams compete with the finished ones
        if not hyps[b].done:
            for beam in range(k):
                hyps[b].add(sequences[i * k + beam].tolist(), float(beam_scores[i * k + beam]))
    return [h.items[0][1][1:] for h in hyps]
