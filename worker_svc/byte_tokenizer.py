"""An offline byte-level tokenizer for the presets: every byte is one token, nothing to download.

Built in code as a Hugging Face `tokenizers` JSON string, so clients load it with
`tokenizers.Tokenizer.from_str(json)` exactly like a real model's tokenizer.json. Special tokens
take the first ids, the 256 byte symbols follow, and `<extra_i>` entries pad the vocab up to the
model's vocab_size so that every id the model can sample decodes to something.
"""
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

LLAMA_SPECIALS = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3}
OPT_SPECIALS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}


def build_byte_tokenizer(vocab_size: int, specials: dict[str, int] = LLAMA_SPECIALS) -> Tokenizer:
    assert sorted(specials.values()) == list(range(len(specials))), "specials take the first ids"
    byte_symbols = pre_tokenizers.ByteLevel.alphabet()  # the 256 printable stand-ins for bytes
    num_base = len(specials) + len(byte_symbols)
    assert vocab_size >= num_base, f"vocab_size {vocab_size} < {num_base} byte-level symbols"
    vocab = dict(specials)
    for i, symbol in enumerate(sorted(byte_symbols)):
        vocab[symbol] = len(specials) + i
    # Padding entries live in the BPE vocab (no merges reach them): cheap, and decodable.
    for i in range(vocab_size - num_base):
        vocab[f"<extra_{i}>"] = num_base + i
    unk = next(t for t in specials if "unk" in t.lower())
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=unk))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in specials])
    return tokenizer


def byte_tokenizer_json(vocab_size: int, specials: dict[str, int] = LLAMA_SPECIALS) -> str:
    return build_byte_tokenizer(vocab_size, specials).to_str()
