"""A tiny SentencePiece tokenizer, trained in a fixture, loaded into
`tokenizers` with the Llama-style decoder (Replace ▁ → space, ByteFallback,
Fuse, Strip one leading space). That decoder strips the space of a word's
leading "▁" when the word is decoded alone, so a detokenizer that decodes
token by token streams words without the spaces between them; the default
model's byte-level BPE never shows this, hence a tokenizer of this kind."""

from __future__ import annotations

import random
from pathlib import Path

import sentencepiece as spm
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

_ENGLISH = (
    "the quick brown fox jumps over lazy dog streaming tokens arrive one at a time and "
    "spaces between words must never vanish while the server answers every request"
).split()
# Common characters become pieces; the rare tail is only reachable through byte fallback.
_CHINESE_COMMON = (
    "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学"
    "对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头"
    "面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明"
)
_CHINESE_RARE = "危险龘齉爨饕餮魑魅魍魉"


def _corpus(lines: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    corpus = []
    for _ in range(lines):
        words = rng.choices(_ENGLISH, k=rng.randint(3, 12))
        han = "".join(rng.choices(_CHINESE_COMMON, k=rng.randint(2, 10)))
        corpus.append(f"{' '.join(words)}. {han}。 {rng.choice(_ENGLISH).capitalize()}!")
    return corpus


def train_sentencepiece_tokenizer(work_dir: Path, vocab_size: int = 600) -> Tokenizer:
    prefix = work_dir / "spm"
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_corpus(1500)),
        model_prefix=str(prefix),
        vocab_size=vocab_size,
        model_type="unigram",
        byte_fallback=True,
        character_coverage=0.98,
        add_dummy_prefix=True,
        normalization_rule_name="identity",
        num_threads=1,
        minloglevel=2,
    )
    processor = spm.SentencePieceProcessor(model_file=str(prefix) + ".model")
    vocab = [(processor.id_to_piece(i), processor.get_score(i)) for i in range(processor.get_piece_size())]
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=processor.unk_id(), byte_fallback=True))
    # Llama's layout: a normalizer writes the ▁ word marks, the decoder undoes them.
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    specials = [
        processor.id_to_piece(i)
        for i in range(processor.get_piece_size())
        if processor.is_control(i) or processor.is_unknown(i)
    ]
    tokenizer.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tokenizer


RARE_CHINESE = _CHINESE_RARE
