"""A Hugging Face hub cache made on disk, laid out as huggingface_hub's downloads leave it, for
tests that name a model by its hub id on a machine with no network (HF_HUB_OFFLINE=1):

    CACHE/models--ORG--NAME/blobs/SHA256                the files' contents
    CACHE/models--ORG--NAME/snapshots/COMMIT/FILE       relative links to those blobs
    CACHE/models--ORG--NAME/refs/REF                    the commit REF (a branch or tag) names
"""
import hashlib
import os


def add_to_hub_cache(cache_dir: str, repo_id: str, folder: str, ref: str = "main") -> str:
    """Puts the files of `folder` in the cache as repo_id's commit at `ref` (a commit hash drawn
    from the repo, the ref and the files' names); returns the commit hash."""
    repo = os.path.join(cache_dir, "models--" + repo_id.replace("/", "--"))
    names = sorted(os.listdir(folder))
    commit = hashlib.sha1(f"{repo_id}@{ref}:{names}".encode()).hexdigest()
    snapshot = os.path.join(repo, "snapshots", commit)
    os.makedirs(snapshot, exist_ok=True)
    os.makedirs(os.path.join(repo, "blobs"), exist_ok=True)
    for name in names:
        with open(os.path.join(folder, name), "rb") as f:
            data = f.read()
        blob = hashlib.sha256(data).hexdigest()
        with open(os.path.join(repo, "blobs", blob), "wb") as f:
            f.write(data)
        os.symlink(os.path.join("..", "..", "blobs", blob), os.path.join(snapshot, name))
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", ref), "w") as f:
        f.write(commit)
    return commit
