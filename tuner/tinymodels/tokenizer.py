"""Word-level tokenizer for local test models: word ``w<i>`` is token id ``i``.

A prompt of N words ``"w17 w4 w903"`` is exactly N tokens (no BOS, no merges), so a client that
only speaks text can still send prompts of exact token lengths, and the server's prompt/usage
counts can be checked against what was sent. Built from the ``tokenizers`` package alone: nothing
is downloaded.
"""

from __future__ import annotations

from pathlib import Path

#: text of the end-of-sequence token; its id is ``words`` (one past the last word), outside the
#: model's output logits, so generation never stops before ``max_tokens``
EOS_TEXT = "</s>"
UNK_TEXT = "<unk>"


def word(i: int) -> str:
    return f"w{i}"


def words_text(token_ids) -> str:
    """The prompt text whose tokens are ``token_ids`` (each in ``[0, words)``)."""
    return " ".join(f"w{int(t)}" for t in token_ids)


def build_tokenizer(words: int):
    """A ``tokenizers.Tokenizer`` with ids 0..words-1 = ``w0``..``w{words-1}``, then ``</s>``.

    ``<unk>`` maps to ``w0`` (id 0): a word outside the vocabulary still costs exactly one token.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    if words < 2:
        raise ValueError(f"a tokenizer needs at least 2 words, got {words}")
    vocab = {word(i): i for i in range(words)}
    vocab[EOS_TEXT] = words
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=word(0)))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    # WordPiece's decoder joins tokens with spaces: streamed text is " w5", " w9", ...
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return tok


def save_tokenizer(out_dir: str | Path, words: int, *, model_max_length: int) -> dict:
    """Write tokenizer.json + tokenizer_config.json loadable by ``AutoTokenizer``."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer(words),
        eos_token=EOS_TEXT,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    fast.save_pretrained(str(out_dir))
    return {"words": words, "eos_token_id": words, "tokenizer_size": words + 1}
