"""Where a model's files are: what `--model` names, turned into a preset name or a local folder.

The rule (vLLM's): a preset name or an existing folder is itself; otherwise a name of the form
ORG/NAME is a Hugging Face hub id, fetched into the hub's cache (`--download-dir`, else
HF_HUB_CACHE / HF_HOME) at `--revision` (a branch, tag or commit; default main) with
huggingface_hub's snapshot_download, and its snapshot folder is where the files are. HF_TOKEN
reaches private and gated models; HF_HUB_OFFLINE=1 takes the cache alone. Any other name is left
as it is, for read_config to refuse.

Only what the worker reads is downloaded: config.json, the tokenizer's and the chat template's
files, generation_config.json, and one format of weights (safetensors where the repository has
them, else .bin; none for --load-format dummy); of a sharded checkpoint, the shards its index
names. `weight_files` is that choice, for the download and for the loader alike.

Each worker resolves the name itself (workers may run on other hosts: the id, revision and
download dir travel as its flags), and so does a launcher that reads the files on its own host
(stepserve/launcher.py). Imports neither torch nor, unless a hub id is given, huggingface_hub.
"""
import functools
import json
import logging
import os
import re
from collections.abc import Callable, Collection

from worker_svc import presets

log = logging.getLogger(__name__)
CONFIG_FILE = "config.json"
# The files besides the weights that the worker reads (loader.py): config, tokenizer, chat
# template and sampling defaults.
MODEL_FILES = (CONFIG_FILE, "generation_config.json", "tokenizer.json", "tokenizer_config.json",
               "special_tokens_map.json", "chat_template.jinja",
               # sentence-transformers' modules and its Pooling module's config (pooling_config.py)
               "modules.json", "config_sentence_transformers.json", "1_Pooling/config.json")
# Per weight format, in the order `auto` prefers them: the files' suffix and the index a sharded
# checkpoint keeps next to them.
WEIGHT_FORMATS = {"safetensors": (".safetensors", "model.safetensors.index.json"),
                  "pt": (".bin", "pytorch_model.bin.index.json")}
# huggingface_hub's rule for a repository id (validate_repo_id), with the ORG/ part required:
# letters, digits, "_", "-" and ".", each part starting and ending with a letter, digit or "_",
# no "--" nor "..".
_HUB_ID = re.compile(r"(?!.*(?:--|\.\.))\w(?:[\w.-]*\w)?/\w(?:[\w.-]{0,94}\w)?")


class ModelUnavailable(RuntimeError):
    """A hub id that cannot be had here; str(): one line naming it and what to do."""


def is_hub_id(model: str) -> bool:
    """Whether `model` has the form of a Hugging Face hub id (ORG/NAME); resolve_model takes an
    existing folder or a preset of that name first."""
    return _HUB_ID.fullmatch(model) is not None


def resolve_model(model: str, revision: str | None = None, download_dir: str | None = None,
                  load_format: str = "auto") -> str:
    """The preset name or local folder to load for `model` (a preset, a folder or a hub id;
    revision and download_dir apply to a hub id only); raises ModelUnavailable for a hub id
    that can be had neither from the hub nor from the cache."""
    if presets.is_preset(model) or os.path.isdir(model) or not is_hub_id(model):
        return model
    return _hub_snapshot(model, revision, download_dir, load_format)


@functools.cache  # a worker's start-up check and its loader ask once: one download, one look-up
def _hub_snapshot(model: str, revision: str | None, download_dir: str | None, load_format: str) -> str:
    try:
        from huggingface_hub import constants
    except ModuleNotFoundError:
        raise ModelUnavailable(f"cannot load model {model!r}: no such folder, and a Hugging Face hub id needs the "
                               "huggingface_hub package: pip install 'stepserve[server]'") from None
    cache_dir = download_dir or constants.HF_HUB_CACHE
    folder = _snapshot(model, revision, cache_dir, load_format, offline=constants.HF_HUB_OFFLINE)
    if not os.path.isfile(os.path.join(folder, CONFIG_FILE)):
        raise ModelUnavailable(f"cannot load model {model!r}: its files ({folder}) have no {CONFIG_FILE}: "
                               "not a transformers model")
    return folder


def weight_files(names: Collection[str], load_format: str, read_index: Callable[[str], dict]) -> list[str]:
    """The checkpoint files to load among a folder's top-level file names: safetensors first
    (load_format auto or safetensors), else .bin (auto or pt); [] if none (or dummy). Where the
    format's index is among them, only the files it names: a repository may also hold the same
    weights consolidated under other names (Mistral's consolidated.safetensors).
    read_index(name): the index file's JSON."""
    for name, (suffix, index) in WEIGHT_FORMATS.items():
        if load_format not in ("auto", name):
            continue
        if index in names:
            return sorted(set(read_index(index)["weight_map"].values()))
        found = sorted(n for n in names if n.endswith(suffix))
        if found:
            return found
    return []


def _snapshot(repo_id: str, revision: str | None, cache_dir: str, load_format: str, offline: bool) -> str:
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
    if offline:
        return _cached_snapshot(repo_id, revision, cache_dir, "HF_HUB_OFFLINE=1 forbids downloading it: run "
                                "once with network access, or unset HF_HUB_OFFLINE")
    name = repr(repo_id)
    try:
        return _download(repo_id, revision, cache_dir, load_format)
    except GatedRepoError:
        raise ModelUnavailable(f"cannot load model {name}: it is gated on the Hugging Face Hub: accept its terms "
                               f"at https://huggingface.co/{repo_id} and set HF_TOKEN") from None
    except RepositoryNotFoundError:
        raise ModelUnavailable(f"cannot load model {name}: no such folder, and the Hugging Face Hub has no model "
                               f"{name} (check the id; a private model needs HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise ModelUnavailable(f"cannot load model {name}: the Hugging Face Hub has no revision {revision!r} "
                               "of it") from None
    # Any other failure is the hub out of reach (no network, a proxy, an outage): its
    # exception classes differ with huggingface_hub's HTTP client, and the cache may hold the model.
    except Exception as e:
        unreachable = f"the Hugging Face Hub could not be reached ({_one_line(e)})"
        folder = _cached_snapshot(repo_id, revision, cache_dir, f"{unreachable}: check the network (HF_ENDPOINT, "
                                  "proxies)")
        log.warning("%s: %s; serving the copy in its cache", repo_id, unreachable)
        return folder


def _download(repo_id: str, revision: str | None, cache_dir: str, load_format: str) -> str:
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download
    # model_info lists the files in one request (list_repo_files pages with retries: half a
    # minute of them where the hub cannot be reached).
    siblings = HfApi().model_info(repo_id, revision=revision).siblings or []
    all_names = [s.rfilename for s in siblings]
    names = [n for n in all_names if "/" not in n]

    def read_index(index: str) -> dict:
        with open(hf_hub_download(repo_id, index, revision=revision, cache_dir=cache_dir)) as f:
            return json.load(f)

    indexes = [index for _, index in WEIGHT_FORMATS.values()]
    weights = [] if load_format == "dummy" else weight_files(names, load_format, read_index)
    wanted = [n for n in all_names if n in MODEL_FILES or n in indexes] + weights
    return snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, allow_patterns=wanted)


def _cached_snapshot(repo_id: str, revision: str | None, cache_dir: str, why_not_downloaded: str) -> str:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError
    try:
        # Only config.json is required of the snapshot: it holds a selection of the repository's
        # files, and huggingface_hub's completeness check would count the others as missing.
        folder = snapshot_download(repo_id, revision=revision, cache_dir=cache_dir, local_files_only=True,
                                   allow_patterns=[CONFIG_FILE])
    except LocalEntryNotFoundError:
        at = f" at revision {revision!r}" if revision else ""
        raise ModelUnavailable(f"cannot load model {repo_id!r}: no such folder, and not in the Hugging Face cache "
                               f"({cache_dir}){at}; {why_not_downloaded}") from None
    return folder


def _one_line(error: Exception) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:300]}"
