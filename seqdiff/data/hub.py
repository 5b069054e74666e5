"""Hugging Face hub datasets, offline first: the local cache, then the hub only when it answers.

`load_hub_dataset(path, config, split)` is `datasets.load_dataset(path, config, split=split)` without the
library's behaviour on a machine that cannot reach the hub: about 30 s of retried requests before an error that
does not say what to do instead. In order:
1. The user's own switch wins: `HF_DATASETS_OFFLINE`, else `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`) set in
   the environment. True (1, yes, on): the cache only, and `HubUnavailable` when the dataset is not there.
   False (0, no, off): the library's own path, as if seqdiff were not involved (online, with its retries).
2. Unset: the local cache first, with the libraries' offline switches on for the duration (no request is
   made; a cached copy is used as it is, without asking the hub for a newer revision).
3. Not cached: one short request to the hub endpoint (`PROBE_TIMEOUT` seconds). It answers: the library's
   online path downloads the dataset into its cache. It does not: `HubUnavailable` at once, naming the cache
   folder looked in and why the hub was not reached.

`datasets` and `huggingface_hub` are imported when a hub dataset is loaded, not with this module.
"""

from __future__ import annotations

import contextlib
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from seqdiff.errors import SeqdiffError

OFFLINE_ENV = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
"""Environment variables that switch the Hugging Face libraries offline, in the order `datasets` reads them."""
TRUE_VALUES = {"1", "ON", "YES", "TRUE"}
PROBE_TIMEOUT = 5.0
"""Seconds the hub endpoint has to answer before it counts as unreachable."""


class HubUnavailable(SeqdiffError):
    """A hub dataset that is not in the local cache while the hub cannot be reached (or offline mode is on)."""


def user_offline_setting() -> tuple[str, bool] | None:
    """(variable, on) for the first offline switch set (non-empty) in the environment; None when none is."""
    for name in OFFLINE_ENV:
        value = os.environ.get(name, "").strip()
        if value:
            return name, value.upper() in TRUE_VALUES
    return None


def cache_folder(path: str, config: str | None) -> Path:
    """The folder under the `datasets` cache where `load_dataset(path, config)` keeps its prepared copy."""
    import datasets.config
    from datasets.naming import camelcase_to_snakecase

    parts = path.split("/")
    parts[-1] = camelcase_to_snakecase(parts[-1])
    folder = Path(os.path.expanduser(str(datasets.config.HF_DATASETS_CACHE))) / "___".join(parts)
    return folder / config if config else folder


@contextlib.contextmanager
def hub_offline() -> Iterator[None]:
    """The Hugging Face libraries' offline switches on for the duration: `load_dataset` reads its cache only
    and makes no request."""
    import datasets.config as dconfig
    import huggingface_hub.constants as hconstants

    names = [(dconfig, "HF_HUB_OFFLINE"), (dconfig, "HF_DATASETS_OFFLINE"), (hconstants, "HF_HUB_OFFLINE")]
    names = [(module, name) for module, name in names if hasattr(module, name)]
    saved = [getattr(module, name) for module, name in names]
    for module, name in names:
        setattr(module, name, True)
    try:
        yield
    finally:
        for (module, name), value in zip(names, saved):
            setattr(module, name, value)


def hub_endpoint() -> str:
    import datasets.config

    return str(getattr(datasets.config, "HF_ENDPOINT", "https://huggingface.co")).rstrip("/")


def probe_hub(endpoint: str, timeout: float = PROBE_TIMEOUT) -> str | None:
    """None when `endpoint` answers one HTTP request within `timeout` seconds with a success or a redirect;
    otherwise why not, in a few words (a proxy that refuses the host answers 403 / 5xx: not reachable either)."""
    try:
        with urllib.request.urlopen(urllib.request.Request(endpoint, method="HEAD"), timeout=timeout):
            return None
    except urllib.error.HTTPError as e:
        return f"HTTP {e.code} {e.reason}"
    except urllib.error.URLError as e:
        return str(e.reason)
    except (OSError, ValueError) as e:  # a timeout, a refused connection, a malformed HF_ENDPOINT
        return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _load(path: str, config: str | None, split: str | None) -> Any:
    import datasets

    return datasets.load_dataset(path, config, split=split)


def _load_cached(path: str, config: str | None, split: str | None) -> Any | None:
    """The dataset (or split) from the local cache with no request made, or None when the cache lacks it."""
    try:
        with hub_offline():
            return _load(path, config, split)
    except (ConnectionError, FileNotFoundError, ValueError) as e:  # not cached (ValueError: not this config)
        if isinstance(e, ValueError) and "cache" not in str(e).lower():
            raise
        return None


def load_hub_dataset(path: str, config: str | None = None, split: str | None = None) -> Any:
    """`datasets.load_dataset(path, config, split=split)`, offline first (see the module docstring); every split
    (a DatasetDict) when `split` is None. Raises HubUnavailable, naming the cache folder looked in and why the
    hub was not asked or not reached, when the dataset is neither cached nor reachable."""
    where = f"looked in {cache_folder(path, config)}"
    setting = user_offline_setting()
    if setting is not None:
        variable, offline = setting
        if not offline:
            return _load(path, config, split)  # the user asked for the library's own online behaviour
        rows = _load_cached(path, config, split)
        if rows is None:
            raise HubUnavailable(f"not in the local Hugging Face datasets cache ({where}) and offline mode is "
                                 f"on ({variable}={os.environ[variable]})")
        return rows
    rows = _load_cached(path, config, split)
    if rows is not None:
        return rows
    endpoint = hub_endpoint()
    why = probe_hub(endpoint)
    if why is not None:
        raise HubUnavailable(f"not in the local Hugging Face datasets cache ({where}) and the hub cannot be "
                             f"reached ({endpoint}: {why})")
    return _load(path, config, split)
