"""score's rules, as vLLM's LLM.score: which texts are paired, and an embedding pair's score."""
import math


def score_pairs(text_1: str | list[str], text_2: str | list[str]) -> tuple[list[str], list[str]]:
    """(firsts, seconds), one pair per position: one text_1 against each text_2, or text_1[i]
    with text_2[i] for lists of equal length."""
    firsts = [text_1] if isinstance(text_1, str) else list(text_1)
    seconds = [text_2] if isinstance(text_2, str) else list(text_2)
    if not firsts or not seconds:
        raise ValueError("score needs at least one text_1 and one text_2")
    if len(firsts) == 1:
        return firsts * len(seconds), seconds
    if len(firsts) != len(seconds):
        raise ValueError(f"text_1 has {len(firsts)} texts and text_2 {len(seconds)}: give one text_1, "
                         "or as many as text_2 (scored pairwise)")
    return firsts, seconds


def cosine(a: list[float], b: list[float]) -> float:
    """Cosine similarity, as vLLM scores two embeddings (the embedding model's score)."""
    norms = math.sqrt(math.fsum(x * x for x in a)) * math.sqrt(math.fsum(y * y for y in b))
    return math.fsum(x * y for x, y in zip(a, b)) / norms if norms else 0.0
