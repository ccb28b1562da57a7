"""LLM: the offline entry point, starting its own scheduler and worker processes."""
import pytest

from stepserve import LLM, SamplingParams


def test_llm_generates_for_text_and_token_prompts_in_order():
    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    with LLM(model="micro-llama", dtype="float32", kv_cache_gb=0.05) as llm:
        outputs = llm.generate(["hello", [5, 6, 7], "the quick brown fox"], params)
        assert [len(o.outputs[0].token_ids) for o in outputs] == [6, 6, 6]
        assert [o.outputs[0].finish_reason for o in outputs] == ["length"] * 3
        assert outputs[1].num_prompt_tokens == 3
        assert all(isinstance(o.outputs[0].text, str) for o in outputs)
        again = llm.generate("hello", params)  # a single prompt; greedy is deterministic
        assert again[0].outputs[0].token_ids == outputs[0].outputs[0].token_ids


def test_llm_with_an_unknown_model_fails_fast_with_the_workers_reason():
    with pytest.raises(RuntimeError) as err:
        LLM(model="no-such-model-anywhere", startup_timeout_s=120)
    assert "no-such-model-anywhere" in str(err.value)


def test_llm_prefix_caching_on_by_default_and_off_on_request():
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    prompts = [[5] * 40 + [6], [5] * 40 + [7]]  # a shared 40-token prefix
    outputs = {}
    # The default replicas (one per core): each caches its own prefixes, and prefix routing sends
    # the second prompt to the one that computed the first, whichever asks for it.
    for enable in (None, False):
        with LLM(model="micro-llama", dtype="float32", kv_cache_gb=0.05, enable_prefix_caching=enable,
                 enforce_eager=True) as llm:
            outputs[enable] = [o.outputs[0].token_ids for o in llm.generate(prompts[:1], params) + llm.generate(prompts[1:], params)]
            health = llm.client.health()
            assert (health.num_prefix_cache_hits > 0) == (enable is None)
    assert outputs[None] == outputs[False]
