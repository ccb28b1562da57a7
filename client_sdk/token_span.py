"""The most characters of text one token can stand for, read from a tokenizer's JSON: with it a
prompt too long to fit the model's context is refused from its length alone, before paying for
its tokenization (which costs time and, for a long text, gigabytes of offsets).

No constant bounds every tokenizer: one whose pipeline deletes text (BERT's whitespace
splitting, a Replace with nothing, an added token that strips the spaces around it, an unknown
run fused into one token) maps any number of characters to no token or one. So the bound is
derived per tokenizer, and None (no bound: tokenize, then count) wherever a step could delete.

Where it holds: every token covers a contiguous piece of the normalized, pre-tokenized text, at
most as long as the token's own string in the vocabulary (byte-level symbols and `▁` stand one
for one for the bytes or spaces they replace, a byte-fallback token `<0x41>` is longer than the
one byte it covers, added tokens match their content literally). Pre-tokenizers kept here only
split or substitute one for one; the one step that shrinks text is Unicode composition (NFC,
NFKC), which joins at most 4 characters into one (Ω + 3 accents -> ᾯ), and a Replace of a
longer literal by a shorter one, by their ratio.
"""
import json
import math

COMPOSITION_FACTOR = 4  # NFC / NFKC: at most this many characters compose into one
_COMPOSING = {"NFC", "NFKC"}
_KEEPING_NORMALIZERS = {"NFD", "NFKD", "Lowercase", "Prepend", "ByteLevel"}
_KEEPING_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Digits", "UnicodeScripts"}
_SPLITTERS = {"Split", "Punctuation"}  # keep everything unless their behavior is "Removed"


def max_chars_per_token(tokenizer_json: str) -> int | None:
    """An upper bound on the characters of input text one token of this tokenizer covers;
    None when the tokenizer may delete text, so that no bound holds."""
    spec = json.loads(tokenizer_json)
    if any(t.get("lstrip") or t.get("rstrip") for t in spec.get("added_tokens") or ()):
        return None
    longest = _longest_token(spec.get("model") or {})
    shrink = _normalizer_shrink(spec.get("normalizer"))
    if longest is None or shrink is None or not _pre_tokenizer_keeps(spec.get("pre_tokenizer")):
        return None
    longest = max([longest, *(len(t.get("content", "")) for t in spec.get("added_tokens") or ())])
    return math.ceil(longest * shrink)


def _longest_token(model: dict) -> int | None:
    kind = model.get("type")
    if kind == "BPE":
        # An unknown run fused into one unk token has no length bound; byte fallback never needs unk.
        if model.get("unk_token") is not None and model.get("fuse_unk") and not model.get("byte_fallback"):
            return None
        return max(map(len, model.get("vocab") or {"": 0}))
    if kind == "Unigram" and model.get("byte_fallback"):  # Unigram fuses unknown runs otherwise
        return max((len(piece) for piece, _ in model.get("vocab") or ()), default=0)
    return None  # WordPiece, WordLevel: a word past their limit is one unk token


def _normalizer_shrink(normalizer: dict | None) -> float | None:
    """How many characters of input one character of normalized text may stand for."""
    if normalizer is None:
        return 1.0
    kind = normalizer.get("type")
    if kind == "Sequence":
        factor = 1.0
        for step in normalizer.get("normalizers") or ():
            shrink = _normalizer_shrink(step)
            if shrink is None:
                return None
            factor *= shrink
        return factor
    if kind in _COMPOSING:
        return COMPOSITION_FACTOR
    if kind in _KEEPING_NORMALIZERS:
        return 1.0
    if kind == "Replace":
        pattern, content = (normalizer.get("pattern") or {}).get("String"), normalizer.get("content") or ""
        if pattern is None or not content:
            return None  # a regex may match any length; nothing instead of something deletes
        return max(1.0, len(pattern) / len(content))
    return None  # Strip, StripAccents, BertNormalizer, Precompiled, ...: may delete characters


def _pre_tokenizer_keeps(pre_tokenizer: dict | None) -> bool:
    if pre_tokenizer is None:
        return True
    kind = pre_tokenizer.get("type")
    if kind == "Sequence":
        return all(map(_pre_tokenizer_keeps, pre_tokenizer.get("pretokenizers") or ()))
    if kind in _SPLITTERS:
        return pre_tokenizer.get("behavior") != "Removed"
    return kind in _KEEPING_PRE_TOKENIZERS  # Whitespace, WhitespaceSplit, BertPreTokenizer drop spaces
