"""A Hugging Face fast tokenizer rebuilt from a GGUF file's metadata.

A GGUF carries no `tokenizer.json`, only llama.cpp's description of one: the tokens, their types
(1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte), the merges or scores, the
special ids, and `tokenizer.ggml.pre`, the name of the text splitting its merges were learned on.
Two kinds are rebuilt with the `tokenizers` library:

- `gpt2`: byte-level BPE. The split is llama.cpp's regular expressions for the named pre-tokenizer
  (`llama-vocab.cpp`), applied in order, then the byte-level alphabet: SmolLM's splits every digit
  apart, Llama 3's takes up to three digits together, Qwen2's one. A name not in `PRE_TOKENIZERS` is
  refused: guessing would tokenize numbers differently from what the model was trained on.
- `llama`: SentencePiece BPE with byte fallback (Gemma, Llama 2, Mistral). A space is written "▁";
  the merges are recovered from the vocabulary, ranked by score, or for Gemma, whose scores do not
  follow its merge order, by position in the file (as transformers' GGUF loader does).

Control tokens become special tokens, user-defined ones added tokens, so `<|im_end|>` stays one id.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@dataclass(frozen=True)
class PreTokenizer:
    splits: tuple[str, ...]
    ignore_merges: bool = False  # a word that is itself a token is taken whole (Llama 3's tokenizer.json)


_LLAMA3 = PreTokenizer((_LLAMA3_SPLIT,), ignore_merges=True)
_QWEN2 = PreTokenizer((_QWEN2_SPLIT,))
_DIGITS_THEN_GPT2 = PreTokenizer((r"\p{N}", _GPT2_SPLIT))
# `tokenizer.ggml.pre` -> how text is split before the merges (llama.cpp's llama-vocab.cpp).
PRE_TOKENIZERS = {
    "llama3": _LLAMA3, "llama-v3": _LLAMA3, "llama-bpe": _LLAMA3, "falcon3": _LLAMA3, "dbrx": _LLAMA3,
    "smaug-bpe": _LLAMA3,
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2, "stablelm2": _QWEN2,
    "smollm": _DIGITS_THEN_GPT2, "starcoder": _DIGITS_THEN_GPT2, "refact": _DIGITS_THEN_GPT2,
    "command-r": _DIGITS_THEN_GPT2,
    "gpt-2": PreTokenizer((_GPT2_SPLIT,)), "gpt2": PreTokenizer((_GPT2_SPLIT,)),
}
CONTROL, USER_DEFINED, BYTE = 3, 4, 6
# Texts llama.cpp treats as ending a generation when the file marks them control tokens.
END_OF_TURN_TEXTS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<|endoftext|>",
                     "<|return|>", "<EOT>")


@dataclass
class GgufVocabulary:
    """The tokenizer part of a GGUF's metadata."""

    model: str  # tokenizer.ggml.model: "gpt2" or "llama"
    pre: str
    tokens: list[str]
    token_types: list[int]
    merges: list[str] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    bos_id: int | None = None
    eos_id: int | None = None
    eot_id: int | None = None
    unk_id: int | None = None
    pad_id: int | None = None
    add_bos: bool = False
    add_space_prefix: bool = False
    architecture: str = ""

    def token(self, index: int | None) -> str | None:
        if index is None:
            return None
        if not 0 <= index < len(self.tokens):
            raise ValueError(f"special token id {index} is outside the vocabulary of {len(self.tokens)} tokens")
        return self.tokens[index]


def build_tokenizer(vocab: GgufVocabulary, chat_template: str):
    """A `PreTrainedTokenizerFast` equal to the one the GGUF describes, with `chat_template`."""
    from transformers import PreTrainedTokenizerFast

    if vocab.model == "gpt2":
        core = _byte_level(vocab)
    elif vocab.model == "llama":
        core = _sentencepiece(vocab)
    else:
        raise ValueError(f"tokenizer.ggml.model = {vocab.model!r} is not supported (gpt2 byte-level BPE and llama "
                         f"SentencePiece BPE are)")
    _add_special_tokens(core, vocab)
    if vocab.add_bos and vocab.bos_id is not None:
        from tokenizers import processors

        bos = vocab.tokens[vocab.bos_id]
        core.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                            special_tokens=[(bos, vocab.bos_id)])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=vocab.token(vocab.bos_id),
        eos_token=vocab.token(vocab.eos_id),
        unk_token=vocab.token(vocab.unk_id),
        pad_token=vocab.token(vocab.pad_id if vocab.pad_id is not None else vocab.eos_id),
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = chat_template
    return tokenizer


def _byte_level(vocab: GgufVocabulary):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    pre = PRE_TOKENIZERS.get(vocab.pre)
    if pre is None:
        raise ValueError(f"tokenizer.ggml.pre = {vocab.pre!r} is not a text split artmlx knows (known: "
                         f"{', '.join(sorted(PRE_TOKENIZERS))}); numbers and words would be tokenized differently "
                         "from the model's training")
    merges = [tuple(merge.split(" ", 1)) for merge in vocab.merges]
    model = models.BPE(vocab={token: i for i, token in enumerate(vocab.tokens)}, merges=merges,
                       ignore_merges=pre.ignore_merges)
    core = Tokenizer(model)
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(split), behavior="isolated") for split in pre.splits]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    core.decoder = decoders.ByteLevel()
    return core


def _sentencepiece(vocab: GgufVocabulary):
    from tokenizers import Tokenizer, decoders, models, normalizers

    # Gemma's files spell a token of several spaces with real spaces; SentencePiece writes them as "▁".
    tokens = ["\u2581" * len(t) if t and not t.strip(" ") else t for t in vocab.tokens]
    if vocab.architecture.startswith("gemma") or not vocab.scores:
        rank = {token: i for i, token in enumerate(tokens)}
    else:
        order = sorted(range(len(tokens)), key=lambda i: -vocab.scores[i])
        rank = {tokens[i]: position for position, i in enumerate(order)}
    mergeable = {t: i for i, (t, kind) in enumerate(zip(tokens, vocab.token_types)) if kind not in (CONTROL, BYTE)}
    candidates = []
    for token in mergeable:
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in mergeable and right in mergeable:
                candidates.append((rank[token], rank[left], rank[right], left, right))
    candidates.sort()
    model = models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=[(c[3], c[4]) for c in candidates],
                       byte_fallback=True, fuse_unk=True, unk_token=vocab.token(vocab.unk_id))
    core = Tokenizer(model)
    steps = [normalizers.Prepend("\u2581")] if vocab.add_space_prefix else []
    core.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", "\u2581")])
    decode = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if vocab.add_space_prefix:
        decode.append(decoders.Strip(" ", 1, 0))
    core.decoder = decoders.Sequence(decode)
    return core


def _add_special_tokens(core, vocab: GgufVocabulary) -> None:
    """Control tokens as special tokens; user-defined ones as added tokens where the model's vocabulary spells
    them as the file does (Gemma's whitespace runs, respelled with "▁", stay the model's own, as in
    transformers' GGUF loader): an added token the vocabulary lacks would get a new id past the embedding."""
    from tokenizers import AddedToken

    known = core.get_vocab()
    control = [AddedToken(t, special=True, normalized=False)
               for t, kind in zip(vocab.tokens, vocab.token_types) if kind == CONTROL and t in known]
    user = [AddedToken(t, special=False, normalized=False)
            for t, kind in zip(vocab.tokens, vocab.token_types) if kind == USER_DEFINED and t in known]
    core.add_special_tokens(control)
    core.add_tokens(user)


def end_of_turn_ids(vocab: GgufVocabulary, chat_template: str) -> list[int]:
    """The ids that end a reply: eos, the file's end-of-turn id, and the end-of-turn tokens the chat
    template writes (Gemma's `<end_of_turn>`, whose file names only `<eos>`)."""
    ids = [i for i in (vocab.eos_id, vocab.eot_id) if i is not None]
    for index, (token, kind) in enumerate(zip(vocab.tokens, vocab.token_types)):
        if kind == CONTROL and token in END_OF_TURN_TEXTS and token in chat_template and index not in ids:
            ids.append(index)
    return ids
