"""Random bytes into every decoder of stored or archived bytes (the targets of
bench/fuzz.py, where atheris runs them for minutes): the answer may be a value or a pitstop
error, never another exception. Bounded examples, so the default suite stays quick; the
committed corpus (bench/corpus/) with random bit flips goes deeper than random bytes."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pitstop
from conftest import ROOT


def _load_fuzz() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pitstop_bench_fuzz", ROOT / "bench" / "fuzz.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fuzz = _load_fuzz()
NAMES = sorted(fuzz.TARGETS)
CORPUS: dict[str, list[bytes]] = {
    name: [p.read_bytes() for p in sorted((ROOT / "bench" / "corpus" / name).iterdir())]
    for name in NAMES
}
FAST = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _target(name: str) -> Callable[[bytes], None]:
    checked: Callable[[bytes], None] = fuzz.checked(fuzz.TARGETS[name])
    return checked


def test_every_target_has_a_corpus() -> None:
    assert all(CORPUS[name] for name in NAMES), {n: len(c) for n, c in CORPUS.items()}
    assert sum(len(b) for c in CORPUS.values() for b in c) < 64 * 1024


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.slow
def test_random_bytes_end_in_a_value_or_a_pitstop_error(name: str) -> None:
    @FAST
    @given(st.binary(max_size=2048))
    def run(data: bytes) -> None:
        _target(name)(data)

    run()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.slow
def test_flipped_corpus_inputs_end_in_a_value_or_a_pitstop_error(name: str) -> None:
    seeds = CORPUS[name]

    @FAST
    @given(st.integers(0, len(seeds) - 1),
           st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 7)), max_size=6),
           st.integers(0, 1 << 20))
    def run(which: int, flips: list[tuple[int, int]], cut: int) -> None:
        data = bytearray(seeds[which])
        for at, bit in flips:
            if data:
                data[at % len(data)] ^= 1 << bit
        if cut % 4 == 0 and data:  # sometimes truncated too
            data = data[: cut % len(data)]
        _target(name)(bytes(data))

    run()


def test_the_corpus_itself_decodes() -> None:
    for name in NAMES:
        for data in CORPUS[name]:
            fuzz.TARGETS[name](data)  # valid inputs: no error at all


# -- what the fuzzer found (#34) --------------------------------------------------------------


def test_a_manifest_whose_root_entries_are_not_entries_is_corruption() -> None:
    import ormsgpack

    from pitstop.serde.chunks import MANIFEST_VERSION

    codec = fuzz.codec()
    for root in ([1, 2], [[b"k", 1]], "root", [[b"k", "1", 2, 0]]):
        manifest = ormsgpack.packb([MANIFEST_VERSION, "list", 2, None, root])
        with pytest.raises(pitstop.CorruptCheckpointError, match="malformed manifest"):
            codec.decode_chunked(manifest, {}, strict=False, run_id="r", checkpoint_id="c",
                                 field="f")


def test_a_url_with_a_bracketed_host_that_is_no_address_is_refused() -> None:
    from pitstop.store.contract.urls import redact

    url = 'postgresql://user:secret@["k"]/db?schema=x'
    with pytest.raises(pitstop.StoreError, match="malformed URL"):
        pitstop.open_store(url)
    assert "secret" not in redact(url)
    # Bytes that are not UTF-8 in $PITSTOP_STORE reach Python as lone surrogates: the URL
    # parsers raised UnicodeEncodeError.
    for bad in ("sqlite:///runs\udcff.db", "memory://?durability=\udcff",
                "postgresql://u@h/db?application_name=\udcff"):
        with pytest.raises(pitstop.StoreError, match="not UTF-8"):
            pitstop.open_store(bad)


def test_bench_corpus_path_is_the_committed_one() -> None:
    assert Path(fuzz.CORPUS) == ROOT / "bench" / "corpus"


def _node_chain(depth: int) -> tuple[bytes, dict[bytes, bytes]]:
    """A list manifest whose root is a chain of ``depth`` nodes of one entry each, ending at
    one leaf: every key matches its chunk, as a crafted store can make them."""
    import ormsgpack

    from pitstop.serde import chunks as chunking
    from pitstop.serde.framing import frame

    codec = fuzz.codec()
    fmt = codec.serializer.format_id
    leaf_raw = ormsgpack.packb(1)
    blobs: dict[bytes, bytes] = {}
    key = chunking.chunk_key(fmt, leaf_raw)
    blobs[key] = frame(leaf_raw, fmt)
    entry = [key, 1, len(leaf_raw), chunking.CUT]
    for _ in range(depth):
        raw = ormsgpack.packb([entry])
        key = chunking.chunk_key(fmt, raw)
        blobs[key] = frame(raw, fmt)
        entry = [key, 1, len(raw), chunking.NODE]
    manifest = ormsgpack.packb([chunking.MANIFEST_VERSION, "list", 1, None, [entry]])
    return manifest, blobs


def test_a_chain_of_nodes_deeper_than_any_tree_is_corruption() -> None:
    codec = fuzz.codec()
    manifest, blobs = _node_chain(3)
    assert codec.decode_chunked(manifest, blobs, strict=False, run_id="r", checkpoint_id="c",
                                field="f") == [1]
    manifest, blobs = _node_chain(5000)
    with pytest.raises(pitstop.CorruptCheckpointError, match="deeper than"):
        codec.decode_chunked(manifest, blobs, strict=False, run_id="r", checkpoint_id="c",
                             field="f")


def test_a_node_chunk_that_is_not_a_list_of_entries_is_corruption() -> None:
    import ormsgpack

    from pitstop.serde import chunks as chunking
    from pitstop.serde.framing import frame

    codec = fuzz.codec()
    fmt = codec.serializer.format_id
    for raw in (ormsgpack.packb(7), ormsgpack.packb([7]), ormsgpack.packb([[b"k", 1, 2]])):
        key = chunking.chunk_key(fmt, raw)
        manifest = ormsgpack.packb([chunking.MANIFEST_VERSION, "list", 1, None,
                                    [[key, 1, len(raw), chunking.NODE]]])
        with pytest.raises(pitstop.CorruptCheckpointError, match="unreadable chunk node"):
            codec.decode_chunked(manifest, {key: frame(raw, fmt)}, strict=False, run_id="r",
                                 checkpoint_id="c", field="f")
