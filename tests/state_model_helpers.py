"""Test tools for the state-model tests (Mamba, Jamba): our model loaded from a saved folder,
random prompts, transformers' greedy continuation, and a mixed run through StateModelDriver."""
import json

import torch
from safetensors.torch import load_file

from tests.state_model_driver import StateModelDriver
from worker_svc.models import model_class

MAX_NEW = 10


def load_ours(folder) -> torch.nn.Module:
    with open(folder / "config.json") as f:
        config = json.load(f)
    model = model_class(config)(config, torch.float32)
    model.load_weights(load_file(str(folder / "model.safetensors")).items())
    return model


def random_prompts(lens, seed=1) -> dict[str, list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return {f"r{i}": torch.randint(3, 1000, (n,), generator=gen).tolist()
            for i, n in enumerate(lens)}


def hf_greedy(hf_model, prompt: list[int], max_new: int) -> list[int]:
    out = hf_model.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False,
                            eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def run_mixed(model, prompts):
    """Few slots and staggered arrivals: batches mix all three kinds and slots get reused."""
    driver = StateModelDriver(model, num_slots=3)
    arrival = {rid: 2 * i for i, rid in enumerate(prompts)}
    outputs = driver.generate(prompts, MAX_NEW, chunk_size=4, arrival_step=arrival)
    return driver, outputs
