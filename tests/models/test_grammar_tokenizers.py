"""The grammar engine reads our tokenizers right: xgrammar's TokenizerInfo, built from a
tokenizer.json (worker_svc.structured_outputs.grammar_compiler), gives each token the bytes the
SDK decodes it to, for the presets' byte-level tokenizer and for trained BPE tokenizers
(GPT-2's byte-level style, and SentencePiece's metaspace style with byte fallback); and a
matcher accepts exactly the tokenization of a valid text."""
import json

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from worker_svc.byte_tokenizer import byte_tokenizer_json
from worker_svc.structured_outputs import grammar_compiler

CORPUS = ['{"name": "alpha", "value": 12, "tags": ["x", "y"]}', "hello world, the quick brown fox",
          "jumps over the lazy dog 0123456789", '{"a": [1, 2, 3], "b": {"c": null, "d": true}}'] * 20
TEXTS = ['{"name": "beta", "value": 7, "tags": []}', '{"a": [1, 2], "b": {"c": false}}', '{"k": "naïve €"}']


def _gpt2_style() -> str:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tokenizer.to_str()


def _sentencepiece_style() -> str:
    """Llama-2 style: metaspace, and <0xXX> byte tokens in the model's vocabulary for what the
    merges do not cover (byte fallback)."""
    tokenizer = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                           decoders.Strip(" ", 1, 0)])
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"]))
    spec = json.loads(tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    return json.dumps(spec)


TOKENIZERS = {"byte-level preset": (byte_tokenizer_json(1000), 1000, 2),
              "gpt2-style bpe": (_gpt2_style(), 416, 0),
              "sentencepiece-style bpe": (_sentencepiece_style(), 432, 2)}


@pytest.mark.parametrize("name", list(TOKENIZERS))
def test_a_valid_text_is_accepted_token_by_token(name):
    import xgrammar
    tokenizer_json, vocab_size, eos = TOKENIZERS[name]
    tokenizer = Tokenizer.from_str(tokenizer_json)
    compiler = grammar_compiler(tokenizer_json, vocab_size, [eos])
    # SentencePiece's normalizer prepends a space ("▁"), which the decoder strips from the
    # text's start only: in a completion that space is text, so the grammar allows it there.
    lead = " " if name.startswith("sentencepiece") else ""
    grammar = compiler.compile_grammar(f'root ::= "{lead}" obj\n' + _JSON_OBJECT_EBNF)
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        assert tokenizer.decode(ids) == text
        matcher = xgrammar.GrammarMatcher(grammar)
        assert all(matcher.accept_token(t) for t in ids), (name, text, ids)
        assert matcher.accept_token(eos) and matcher.is_terminated()
    bad = tokenizer.encode('{"a": }', add_special_tokens=False).ids
    matcher = xgrammar.GrammarMatcher(grammar)
    assert not all(matcher.accept_token(t) for t in bad)


# JSON objects as the test texts write them (", " and ": " separators), strings of any
# character but '"' and '\\'.
_JSON_OBJECT_EBNF = r"""obj ::= "{" (pair (", " pair)*)? "}"
pair ::= str ": " value
value ::= str | num | obj | arr | "true" | "false" | "null"
arr ::= "[" (value (", " value)*)? "]"
str ::= "\"" [^"\\]* "\""
num ::= "-"? [0-9]+
"""


def test_every_byte_level_token_has_the_bytes_the_sdk_decodes():
    import xgrammar
    from transformers import PreTrainedTokenizerFast
    for name in ("byte-level preset", "gpt2-style bpe"):
        tokenizer_json, vocab_size, eos = TOKENIZERS[name]
        tokenizer = Tokenizer.from_str(tokenizer_json)
        info = xgrammar.TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(tokenizer_object=tokenizer),
                                                       vocab_size=vocab_size, stop_token_ids=[eos])
        to_byte = {ch: b for b, ch in enumerate(_bytes_to_unicode())}
        specials = {t.content for t in tokenizer.get_added_tokens_decoder().values()}
        for token, token_id in tokenizer.get_vocab().items():
            if token in specials:
                continue
            assert info.decoded_vocab[token_id] == bytes(to_byte[ch] for ch in token), (name, token)


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table, as ByteLevel uses it (index: the byte)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = [], 0
    for b in range(256):
        if b in printable:
            chars.append(chr(b))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars
