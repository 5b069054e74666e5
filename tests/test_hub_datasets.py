"""Hub datasets offline first (`seqdiff.data.hub`): the local cache without a request, one short question to the
hub when the cache lacks the dataset, and at once a one-line error naming what was looked for and the local-file
alternatives when the hub does not answer; the user's HF_HUB_OFFLINE / HF_DATASETS_OFFLINE are honoured."""

import http.server
import socket
import threading
import time

import pytest

from seqdiff.data import datasets, hub


class NetworkAttempt(AssertionError):
    pass


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """An empty `datasets` cache and data directory of this test; no offline switch from the environment."""
    import datasets as hf_datasets
    import huggingface_hub.constants as hconstants

    for name in hub.OFFLINE_ENV:
        monkeypatch.delenv(name, raising=False)
    # the libraries read those variables once, at import: a test that imported them with one set (in this test
    # process, earlier) would leave them offline for good
    for module, name in ((hf_datasets.config, "HF_HUB_OFFLINE"), (hf_datasets.config, "HF_DATASETS_OFFLINE"),
                         (hconstants, "HF_HUB_OFFLINE")):
        if hasattr(module, name):
            monkeypatch.setattr(module, name, False)
    monkeypatch.setenv("SEQDIFF_DATA", str(tmp_path / "data"))
    cache = tmp_path / "hf-datasets"
    monkeypatch.setattr(hf_datasets.config, "HF_DATASETS_CACHE", cache)
    return cache


@pytest.fixture
def lookups(monkeypatch):
    """Every host name looked up (the first step of any request); each lookup fails as on a machine without
    network, and the retry loops' sleeps fail the test instead of waiting."""
    hosts = []

    def getaddrinfo(host, *args, **kwargs):
        hosts.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    def sleep(seconds):
        raise NetworkAttempt(f"a retry loop waited {seconds} s after {hosts}")

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(time, "sleep", sleep)
    return hosts


def _write_cached_split(cache, path, config, split, texts):
    """What `load_dataset(path, config)` leaves in the `datasets` cache after an online load (prepared Arrow files
    under CACHE/PATH/CONFIG/VERSION/HASH), written by the packaged Parquet builder from a local file."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from datasets.packaged_modules.parquet.parquet import Parquet

    source = cache.parent / f"{split}.parquet"
    pq.write_table(pa.table({"text": texts}), source)
    Parquet(cache_dir=str(cache), dataset_name=path, config_name=config, data_files={split: str(source)},
            hash="0123abcd").download_and_prepare()
    (folder,) = (cache / path).glob(f"{config}-*")  # the builder keys the folder by the data files too
    folder.rename(cache / path / config)


def test_uncached_hub_dataset_fails_at_once_saying_what_to_do(hf_cache, lookups):
    start = time.perf_counter()
    with pytest.raises(datasets.DatasetError) as info:
        datasets.load_documents("wikitext103", "test")
    elapsed = time.perf_counter() - start
    message = str(info.value)
    assert "\n" not in message
    assert "dataset 'wikitext103'" in message and "is not available offline" in message
    assert f"looked in {hf_cache / 'wikitext' / 'wikitext-103-raw-v1'}" in message
    assert "hub cannot be reached (https://huggingface.co: " in message and "Name or service not known" in message
    assert "seqdiff eval RUN --data PATH" in message and "data.corpus=/folder" in message
    assert lookups == ["huggingface.co"]  # one question to the hub, no retries of the library's
    assert elapsed < 5


def test_cached_hub_dataset_is_read_without_any_request(hf_cache, lookups):
    _write_cached_split(hf_cache, "wikitext", "wikitext-103-raw-v1", "test",
                        [" = Title = \n", "", "a @-@ b , c\n"])
    assert datasets.load_documents("wikitext103", "test") == [" = Title = \n", "a @-@ b , c\n"]
    assert lookups == []


def test_user_offline_switch_is_honoured(hf_cache, lookups, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # cache only: the hub is not even asked
    with pytest.raises(datasets.DatasetError, match=r"offline mode is on \(HF_HUB_OFFLINE=1\)"):
        datasets.load_documents("ptb", "valid")
    assert lookups == []

    import datasets as hf_datasets

    calls = []

    def load_dataset(path, name, split):
        calls.append((path, name, split, hf_datasets.config.HF_HUB_OFFLINE))
        return {"sentence": ["a b", " "]}

    monkeypatch.setattr(hf_datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(hf_datasets.config, "HF_HUB_OFFLINE", False)  # what datasets read from HF_DATASETS_OFFLINE=0
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")  # read first, as datasets does: the library's own online path
    assert datasets.load_documents("ptb", "valid") == ["a b"]
    assert calls == [("ptb_text_only", None, "validation", False)]  # no cache-only attempt, no probe before it
    assert lookups == []


def test_not_cached_but_reachable_hub_loads_online(hf_cache, monkeypatch):
    import datasets as hf_datasets

    real_load_dataset = hf_datasets.load_dataset
    calls = []

    def load_dataset(path, name, split):
        calls.append(hf_datasets.config.HF_HUB_OFFLINE)
        if hf_datasets.config.HF_HUB_OFFLINE:  # the cache-only attempt: the real library, on an empty cache
            return real_load_dataset(path, name, split=split)
        return {"text": ["downloaded"]}

    probes = []
    monkeypatch.setattr(hf_datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(hub, "probe_hub", lambda endpoint: probes.append(endpoint))  # None: it answered
    assert datasets.load_documents("lambada", "test") == ["downloaded"]
    assert calls == [True, False] and probes == ["https://huggingface.co"]


class _Handler(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_HEAD(self):
        self.send_response(self.status)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("status, expected", [(200, None), (403, "HTTP 403 Forbidden"), (502, "HTTP 502 Bad Gateway")])
def test_probe_counts_only_a_success_as_reachable(status, expected, monkeypatch):
    monkeypatch.setattr(_Handler, "status", status)
    server = http.server.HTTPServer(("127.0.0.1", 0), _Handler)  # a proxy that refuses a host answers 403 / 5xx
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    try:
        assert hub.probe_hub(f"http://127.0.0.1:{server.server_port}", timeout=5) == expected
    finally:
        server.shutdown()
        server.server_close()
    with socket.socket() as s:  # a port nobody listens on: refused, at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert "refused" in hub.probe_hub(f"http://127.0.0.1:{port}", timeout=5).lower()
