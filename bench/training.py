"""Training and batch benchmark (issue #16): large tensors, async snapshots, auto interval,
resumable iteration, side by side with np.save/np.load, torch.save and torch's distributed
checkpoint in one run.

    .venv/bin/python bench/training.py            # 256 MiB state, 3 interleaved rounds
    .venv/bin/python bench/training.py --quick    # 64 MiB, 1 round, shorter loops
    .venv/bin/python bench/training.py --large-only --rounds 5   # section 1 alone
    .venv/bin/python bench/training.py --small-model --rounds 15 # the ~5 MB model alone

Every figure of a round is taken right after the others of that round, and ratios are
medians of per-round ratios: on a shared 2-core machine absolute times swing widely, ratios
much less. Each timed write starts with no dirty pages (``os.sync()`` first, untimed). Loads
are measured from a warm page cache on both sides (each file read once
before the timed read): what decides a cold read is the disk, the same for everyone. torch
parts are skipped (and said so) when torch is not installed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _common import fmt_time, median_ratio, save_results, table  # takes bench/ off sys.path

import pitstop
from pitstop.runtime.loop import host_copy

MiB = 1 << 20


def timed(fn: Callable[[], Any], *, settle: bool = False) -> float:
    """Seconds ``fn`` takes. ``settle``: write back every dirty page first (untimed), so each
    timed write starts from the same state: the kernel throttles a writer once others'
    unwritten pages pile up, and the later writes of a round would pay for the earlier."""
    if settle:
        os.sync()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def try_torch() -> Any:
    try:
        import torch
    except ImportError:
        print("(torch not installed: torch.save, DCP and state_dict rows skipped)")
        return None
    return torch


# -- 1. save / load of a large state ---------------------------------------------------------------


def large_state_rounds(size: int, rounds: int, tmp: Path, torch: Any) -> dict[str, list[float]]:
    rng = np.random.default_rng(0)
    array = rng.standard_normal(size // 4, dtype=np.float32)
    times: dict[str, list[float]] = {}

    def add(name: str, seconds: float) -> None:
        times.setdefault(name, []).append(seconds)

    state_dict = None
    if torch is not None:
        tensors = torch.from_numpy(array.copy()).chunk(8)
        state_dict = {f"layer{i}.weight": t.clone() for i, t in enumerate(tensors)}
    for r in range(rounds):
        npy = tmp / f"a{r}.npy"

        def np_save(sync: bool, path: Path = npy) -> None:
            with open(path, "wb") as f:
                np.save(f, array)
                f.flush()
                if sync:
                    os.fsync(f.fileno())

        add("np.save + fsync", timed(lambda: np_save(True), settle=True))
        add("np.save", timed(lambda: np_save(False, tmp / "b.npy"), settle=True))
        np.load(npy)  # warm page cache on both sides: each load reads its files once first
        add("np.load", timed(lambda path=npy: np.load(path)))
        for durability in ("full", "normal"):
            # The default layout: chunks of 1 MiB go to "<file>-blobs/" beside the database.
            url = f"sqlite:///{tmp / f'p{r}{durability}.db'}?durability={durability}"
            store = pitstop.open_store(url)
            add(f"pitstop save ({durability})",
                timed(lambda s=store: s.save("r", {"w": array}), settle=True))
            add(f"pitstop re-save unchanged ({durability})",
                timed(lambda s=store: s.save("r", {"w": array})))
            store.close()
            if durability == "full":
                with pitstop.open_store(url) as warm:
                    warm.latest("r")
                with pitstop.open_store(url) as fresh:  # a new handle: nothing cached in it
                    add("pitstop load", timed(lambda s=fresh: s.latest("r")))
        if torch is not None:
            pt = tmp / f"t{r}.pt"

            def torch_save(path: Path = pt) -> None:
                torch.save(state_dict, path)
                fsync_file(path)

            add("torch.save + fsync", timed(torch_save, settle=True))
            torch.load(pt)
            add("torch.load", timed(lambda path=pt: torch.load(path)))
            url = f"sqlite:///{tmp / f'sd{r}.db'}?durability=full"
            store = pitstop.open_store(url)
            add("pitstop save state_dict (full)",
                timed(lambda s=store: s.save("r", {"model": state_dict}), settle=True))
            add("pitstop re-save state_dict unchanged (full)",
                timed(lambda s=store: s.save("r", {"model": state_dict})))
            store.close()
            with pitstop.open_store(url) as warm:
                warm.latest("r")
            with pitstop.open_store(url) as fresh:
                add("pitstop load state_dict", timed(lambda s=fresh: s.latest("r")))
            dcp_time = dcp_save(torch, state_dict, tmp / f"dcp{r}")
            if dcp_time is not None:
                add("torch DCP save", dcp_time)
        for path in tmp.iterdir():  # keep the disk from filling up between rounds
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    return times


def dcp_save(torch: Any, state_dict: dict[str, Any], path: Path) -> float | None:
    try:
        import warnings

        import torch.distributed.checkpoint as dcp

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return timed(lambda: dcp.save(state_dict, checkpoint_id=str(path)), settle=True)
    except Exception as exc:  # not every build has a usable torch.distributed
        print(f"(torch.distributed.checkpoint not measured: {type(exc).__name__}: {exc})")
        return None


# -- 1b. a small model saved in the loop ----------------------------------------------------------


def small_model(torch: Any) -> dict[str, Any]:
    """A nanoGPT-shaped ``state_dict`` (4 layers, 160 wide, 65 tokens, 256 positions): 5.1 MB
    of float32 in tensors of 41-410 KB and a few small ones."""
    n_layer, n_embd, block, vocab = 4, 160, 256, 65
    gen = torch.Generator().manual_seed(0)
    sd = {"transformer.wte.weight": torch.randn(vocab, n_embd, generator=gen),
          "transformer.wpe.weight": torch.randn(block, n_embd, generator=gen)}
    for i in range(n_layer):
        p = f"transformer.h.{i}."
        for name, shape in (
            ("ln_1.weight", (n_embd,)), ("attn.c_attn.weight", (3 * n_embd, n_embd)),
            ("attn.c_proj.weight", (n_embd, n_embd)), ("ln_2.weight", (n_embd,)),
            ("mlp.c_fc.weight", (4 * n_embd, n_embd)), ("mlp.c_proj.weight", (n_embd, 4 * n_embd)),
        ):
            sd[p + name] = torch.randn(*shape, generator=gen)
    sd["transformer.ln_f.weight"] = torch.randn(n_embd, generator=gen)
    return sd


def small_model_rounds(rounds: int, tmp: Path, torch: Any) -> dict[str, list[float]]:
    """``Checkpointer.save`` (synchronous, ``full``, the default retention) of the small model
    against ``torch.save`` to a file + fsync, interleaved; every weight changes between saves
    (as a training step changes them). Also the same with ``retention=None`` (no prune: what
    the default retention adds to a save)."""
    sd = small_model(torch)
    times: dict[str, list[float]] = {}
    ckpts = {
        "Checkpointer.save (full)": pitstop.Checkpointer(
            f"sqlite:///{tmp / 'small.db'}?durability=full", "train"),
        "Checkpointer.save (full), retention=None": pitstop.Checkpointer(
            f"sqlite:///{tmp / 'smallkeep.db'}?durability=full", "train", retention=None),
    }
    pt = tmp / "small.pt"

    def torch_save() -> None:
        torch.save(sd, pt)
        fsync_file(pt)

    with torch.no_grad():
        for r in range(rounds + 1):  # the first round writes every chunk anew: not counted
            for t in sd.values():
                t.add_(0.001)
            took = {"torch.save + fsync": timed(torch_save, settle=True)}
            for name, ckpt in ckpts.items():
                took[name] = timed(lambda c=ckpt, r=r: c.save({"model": sd, "step": r}),
                                   settle=True)
            if r:
                for name, seconds in took.items():
                    times.setdefault(name, []).append(seconds)
    for ckpt in ckpts.values():
        ckpt.close()
    return times


# -- 2. async snapshot: time the loop is blocked -------------------------------------------------


def async_rounds(size: int, rounds: int, tmp: Path, torch: Any) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {}
    if torch is not None:
        weights = {f"w{i}": torch.randn(size // 4 // 8) for i in range(8)}
        copy: Callable[[], Any] = lambda: {k: v.clone() for k, v in weights.items()}  # noqa: E731
    else:
        weights = {f"w{i}": np.ones(size // 4 // 8, dtype=np.float32) for i in range(8)}
        copy = lambda: {k: v.copy() for k, v in weights.items()}  # noqa: E731
    store = pitstop.open_store(f"sqlite:///{tmp / 'async.db'}", blobs=str(tmp / "ablobs"))
    with pitstop.Checkpointer(store, "async", async_save=True) as ckpt:
        for _ in range(rounds):
            times.setdefault("plain copy of the state", []).append(timed(copy))
            times.setdefault("Checkpointer.save, async (blocked)", []).append(
                timed(lambda: ckpt.save(weights, force=True)))
            times.setdefault("host_copy", []).append(timed(lambda: host_copy(weights)))
            ckpt.wait()
    store.close()
    return times


# -- 3. auto interval: measured overhead ---------------------------------------------------------


class SlowValue:
    """A value whose checkpoint takes a fixed time (stands for a large state's write)."""

    seconds = 0.2

    def __init__(self, n: int = 0) -> None:
        self.n = n


def _encode_slow(value: SlowValue) -> int:
    time.sleep(SlowValue.seconds)
    return value.n


pitstop.register(SlowValue, name="bench.slow", encode=_encode_slow, decode=SlowValue)


def auto_overhead(tmp: Path, budget: float, duration: float) -> dict[str, float]:
    store = pitstop.open_store(f"sqlite:///{tmp / 'auto.db'}")
    in_save = 0.0
    taken = 0
    policy = pitstop.CheckpointPolicy.auto(overhead=budget)
    start = time.perf_counter()
    with pitstop.Checkpointer(store, "auto", policy=policy) as ckpt:
        while time.perf_counter() - start < duration:
            time.sleep(0.01)  # a 10 ms training step
            t0 = time.perf_counter()
            if ckpt.save(lambda: {"s": SlowValue(1)}):
                taken += 1
            in_save += time.perf_counter() - t0
    total = time.perf_counter() - start
    store.close()
    return {"overhead": in_save / total, "checkpoints": taken, "seconds": total,
            "interval": ckpt.schedule.interval or 0.0}


# -- 4. resumable iteration ------------------------------------------------------------------------


def work(item: int) -> int:
    """~10 µs of work on one item."""
    total = item
    for k in range(120):
        total = (total * 31 + k) & 0xFFFF
    return total


def iterate_rounds(n: int, rounds: int, tmp: Path) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {}
    for r in range(rounds):
        def bare() -> None:
            acc = 0
            for item in range(n):
                acc += work(item)

        def resumable(r: int = r) -> None:
            with pitstop.Checkpointer(f"sqlite:///{tmp / f'it{r}.db'}", "it") as ckpt:
                state = {"acc": 0}
                for item in ckpt.iterate(range(n), every=1000, state=state):
                    state["acc"] += work(item)

        times.setdefault("bare loop", []).append(timed(bare))
        times.setdefault("ckpt.iterate, every=1000", []).append(timed(resumable))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--large-only", action="store_true", help="only the 256 MiB save/load")
    parser.add_argument("--small-model", action="store_true",
                        help="only Checkpointer.save of a ~5 MB model against torch.save")
    parser.add_argument("--rounds", type=int, default=None)
    args = parser.parse_args()
    size = (64 if args.quick else 256) * MiB
    rounds = args.rounds or (1 if args.quick else 3)
    torch = try_torch()
    sections: list[str] = []
    data: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp_name:
        tmp = Path(tmp_name)
        if args.small_model:
            if torch is None:
                raise SystemExit("--small-model needs torch")
            small_rounds = args.rounds or 15
            print(f"Checkpointer.save of a ~5 MB model, {small_rounds} rounds", flush=True)
            small = small_model_rounds(small_rounds, tmp, torch)
            peer = small["torch.save + fsync"]
            markdown = table(["operation", "median", "vs torch.save + fsync (<= 1.5x)"], [
                [name, fmt_time(statistics.median(series)), f"{median_ratio(series, peer):.2f}x"]
                for name, series in small.items()
            ] + [["load average", f"{os.getloadavg()[0]:.1f}", ""]])
            print(markdown)
            out = save_results("training", "bench/training.py --small-model",
                               {"small_model": small}, markdown)
            print(f"results: {out}")
            return
        print(f"1. save/load of a {size // MiB} MiB float32 state, {rounds} rounds", flush=True)
        big = large_state_rounds(size, rounds, tmp, torch)
        base = {"full": big["np.save + fsync"], "normal": big["np.save"], "load": big["np.load"]}
        rows = []
        for name, series in big.items():
            if "load" in name:
                ref = "load"
            elif "(normal)" in name or name == "np.save":
                ref = "normal"
            else:
                ref = "full"
            ratio = median_ratio(series, base[ref])
            peer = {"load": "np.load", "normal": "np.save", "full": "np.save + fsync"}[ref]
            rows.append([name, fmt_time(statistics.median(series)), f"{ratio:.2f}x {peer}"])
        first = big["pitstop save (full)"]
        resave = big["pitstop re-save unchanged (full)"]
        rows.append(["unchanged re-save / first save (full)", "",
                     f"{median_ratio(resave, first):.1%}"])
        rows.append(["unchanged re-save / first save (normal)", "", "{:.1%}".format(
            median_ratio(big["pitstop re-save unchanged (normal)"], big["pitstop save (normal)"]))])
        if "pitstop save state_dict (full)" in big:
            rows.append(["state_dict: unchanged re-save / first save (full)", "", "{:.1%}".format(
                median_ratio(big["pitstop re-save state_dict unchanged (full)"],
                             big["pitstop save state_dict (full)"]))])
        sections.append(table(["operation", "median", "ratio"], rows))
        data["large"] = big

        if not args.large_only:
            print("2. async snapshot", flush=True)
            snap = async_rounds(size, max(3, rounds), tmp, torch)
            blocked = median_ratio(snap["Checkpointer.save, async (blocked)"],
                                   snap["plain copy of the state"])
            sections.append(table(["operation", "median"], [
                [k, fmt_time(statistics.median(v))] for k, v in snap.items()
            ] + [["blocked / plain copy", f"{blocked:.2f}x"]]))
            data["async"] = snap

            budget, duration = (0.1, 20.0) if args.quick else (0.02, 60.0)
            print(f"3. auto(overhead={budget}), 10 ms steps, 200 ms checkpoints, {duration:.0f} s",
                  flush=True)
            auto = auto_overhead(tmp, budget, duration)
            sections.append(table(["auto policy", "value"], [
                ["budget", f"{budget:.0%}"], ["measured overhead", f"{auto['overhead']:.2%}"],
                ["checkpoints", str(auto["checkpoints"])],
                ["interval chosen", fmt_time(auto["interval"])],
            ]))
            data["auto"] = auto

            n = 200_000 if args.quick else 1_000_000
            print(f"4. iterate over {n} items of ~10 µs", flush=True)
            its = iterate_rounds(n, rounds, tmp)
            slower = median_ratio(its["ckpt.iterate, every=1000"], its["bare loop"]) - 1
            sections.append(table(["loop", "median"], [
                [k, fmt_time(statistics.median(v))] for k, v in its.items()
            ] + [["iterate vs bare", f"{slower:+.1%}"]]))
            data["iterate"] = its
    markdown = "\n\n".join(sections)
    print(markdown)
    flags = (" --quick" if args.quick else "") + (" --large-only" if args.large_only else "")
    out = save_results("training", "bench/training.py" + flags,
                       data, markdown)
    print(f"results: {out}")


if __name__ == "__main__":
    main()
