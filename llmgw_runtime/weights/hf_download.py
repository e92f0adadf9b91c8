"""A Hugging Face download through ``huggingface_hub`` into its standard cache layout under a
weights directory (``<dest>/models--org--repo/{blobs,snapshots}``), where
:func:`~llmgw_runtime.weights.locate.candidates` finds it next time.

The endpoint is the ``endpoint`` argument, else ``HF_ENDPOINT`` read at download time.
The token is passed through and never logged; it is scrubbed from error messages.
Progress is polled from the size of the blobs (finished and ``.incomplete``) that appeared
since the download began; cancelling raises from inside huggingface_hub's progress callback.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from .locate import complete, hf_cache_folder
from .safepath import outside
from .sources import Source
from .transfer import Fetch, FetchCancelled, FetchError

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"


def _blob_sizes(blobs: Path) -> dict[str, int]:
    sizes: dict[str, int] = {}
    try:
        entries = list(os.scandir(blobs))
    except OSError:
        return sizes
    for entry in entries:
        try:
            sizes[entry.name] = entry.stat(follow_symlinks=False).st_size
        except OSError:
            continue
    return sizes


def _cancelling_tqdm(fetch: Fetch) -> type:
    """A silent progress-bar class whose every update stops the download once cancelled."""
    from huggingface_hub.utils import tqdm as hf_tqdm

    class _Tqdm(hf_tqdm):  # type: ignore[misc,valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            fetch.check_cancel()
            return super().update(n)  # type: ignore[no-any-return]

    return _Tqdm


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen:
        seen.append(cur)
        cur = cur.__cause__ or cur.__context__
    return seen


def _reason(src: Source, exc: BaseException) -> str:
    """A plain reason for a huggingface_hub failure."""
    from huggingface_hub import errors as hf

    chain = _chain(exc)
    status = next((getattr(getattr(e, "response", None), "status_code", None) for e in chain
                   if isinstance(e, hf.HfHubHTTPError)), None)
    code = f" (HTTP {status})" if status else ""
    kinds = {type(e) for e in chain}

    def has(cls: type) -> bool:
        return any(issubclass(k, cls) for k in kinds)

    if has(hf.GatedRepoError):
        return (f"{src.repo_id} is a gated repository; accept its terms on the Hub and give "
                f"the agent a token{code}")
    if has(hf.RepositoryNotFoundError):
        return (f"repository {src.repo_id} was not found, or it is private and needs a "
                f"token{code}")
    if has(hf.RevisionNotFoundError):
        return f"the revision of {src.repo_id} was not found{code}"
    if has(hf.RemoteEntryNotFoundError):
        return f"{src.filename} is not in {src.repo_id}{code}"
    if status:
        return f"the Hub answered HTTP {status}"
    if has(hf.OfflineModeIsEnabled):
        return "HF_HUB_OFFLINE is set on this node"
    if has(hf.LocalEntryNotFoundError):
        return "the Hub could not be reached and the files are not in the cache"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _dry_run_total(src: Source, kwargs: dict[str, Any]) -> int | None:
    """Bytes still to download, asked of the Hub without downloading; None if unknown."""
    from huggingface_hub import hf_hub_download, snapshot_download

    try:
        if src.filename is not None:
            info: Any = hf_hub_download(src.repo_id, src.filename, dry_run=True, **kwargs)
            return int(info.file_size) if info.will_download else 0
        infos: Any = snapshot_download(src.repo_id, dry_run=True, **kwargs)
        return sum(int(i.file_size or 0) for i in infos if i.will_download)
    except Exception:  # the real download reports the failure
        return None


def download_hf(fetch: Fetch, src: Source, dest: Path, *, token: str | None = None,
                endpoint: str | None = None) -> Path:
    """Download an ``hf://`` source into the HF cache under ``dest``; the snapshot path.

    FetchError when the repo's cache folder, or what the download produced, resolves outside
    ``dest`` (a link leading elsewhere)."""
    from huggingface_hub import hf_hub_download, snapshot_download

    endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    dest.mkdir(parents=True, exist_ok=True)
    folder = dest / hf_cache_folder(src.org, src.repo)
    problem = outside(dest, folder, f"the cache of {src.repo_id}")
    if problem is not None:
        raise FetchError(f"download of {src.display}: {problem}")
    blobs = folder / "blobs"
    before = set(_blob_sizes(blobs))
    fetch.poll_bytes_with(
        lambda: sum(n for name, n in _blob_sizes(blobs).items() if name not in before))
    kwargs: dict[str, Any] = {"cache_dir": str(dest), "token": token, "endpoint": endpoint}
    fetch.set_total(_dry_run_total(src, kwargs))
    fetch.check_cancel()
    kwargs["tqdm_class"] = _cancelling_tqdm(fetch)
    try:
        if src.filename is not None:
            path = hf_hub_download(src.repo_id, src.filename, **kwargs)
        else:
            path = snapshot_download(src.repo_id, **kwargs)
    except FetchCancelled:
        raise
    except Exception as exc:
        if any(isinstance(e, FetchCancelled) for e in _chain(exc)):
            raise FetchCancelled() from None
        message = f"download of {src.display} from {endpoint} failed: {_reason(src, exc)}"
        if token:
            message = message.replace(token, "***")
        raise FetchError(message) from None
    problem = outside(dest, Path(path), f"the weights of {src.display}")
    if problem is not None:
        raise FetchError(f"download of {src.display}: {problem}")
    reason = complete(path)
    if reason is not None:
        raise FetchError(f"download of {src.display} finished but is not usable: {reason}")
    log.info("downloaded %s to %s", src.display, path)
    return Path(path)
