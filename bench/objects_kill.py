"""SIGKILL during saves to object storage (issue #31), fifty times: no torn checkpoint, no
object a row references missing, every orphan removed by the next prune.

    .venv/bin/python bench/objects_kill.py                # 50 kills, SQLite
    .venv/bin/python bench/objects_kill.py --postgres     # the same on PostgreSQL
    .venv/bin/python bench/objects_kill.py --kills 200

A local S3 server (moto's server mode on loopback) is started here; the harness is the
one the test suite runs with ten kills (tests/s3kill.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

from _common import POSTGRES_URL, save_results  # takes bench/ off sys.path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from s3kill import kill_saves  # (tests/s3kill.py)
from s3server import start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--postgres", action="store_true")
    args = parser.parse_args()
    server = start()
    os.environ.update(server.env())
    try:
        if args.postgres:
            base = POSTGRES_URL
            url = f"{base}{'&' if '?' in base else '?'}schema=kills_{uuid.uuid4().hex[:8]}"
        else:
            url = f"sqlite:///{Path(tempfile.mkdtemp()) / 'kills.db'}"
        t0 = time.perf_counter()
        outcome = kill_saves(url, f"s3://{server.new_bucket()}/pitstop", args.kills, seed=50)
        took = time.perf_counter() - t0
    finally:
        server.stop()
    lines = [
        f"kills: {outcome.kills} of {args.kills} rounds",
        f"checkpoints left: {outcome.saves}",
        f"orphaned objects found before the prune: {outcome.orphans_found} (all removed)",
        f"problems: {len(outcome.problems)}",
        *(f"  {problem}" for problem in outcome.problems),
        f"({took:.0f} s, load average {os.getloadavg()[0]:.1f})",
    ]
    print("\n".join(lines))
    save_results("objects_kill", " ".join(["bench/objects_kill.py", *sys.argv[1:]]),
                 {"kills": outcome.kills, "checkpoints": outcome.saves,
                  "orphans": outcome.orphans_found, "problems": outcome.problems},
                 "\n".join(lines))
    sys.exit(1 if outcome.problems else 0)


if __name__ == "__main__":
    main()
