"""``python -m tests.fuzz [--specs 10000] [--records 3000] [--seed N] [--only KIND:INDEX]``.

Prints each unhandled case with a one-line replay command, each exception the pass
caught as unexpected, and last, exactly: ``fuzz: specs=N records=N unhandled=N``.
Exits 1 when a case is unhandled.
"""

from __future__ import annotations

import argparse
import sys
import time

from tests.fuzz import Finding, run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--specs", type=int, default=10_000, help="generated specs (default 10000)")
    parser.add_argument("--records", type=int, default=3_000,
                        help="VM records and status.json files, a third of them status files (default 3000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the whole run (default 0)")
    parser.add_argument("--only", metavar="KIND:INDEX", help="replay one case, e.g. spec:123, record:7, status:2")
    args = parser.parse_args(argv)

    def show(kind: str, finding: Finding) -> None:
        print(f"{kind}: {finding}", flush=True)
        if kind == "unhandled":
            print(f"  {finding.replay}", flush=True)
        if args.only:
            print(f"  body ({len(finding.case.body)} bytes): {finding.case.body[:300]!r}", flush=True)

    started = time.monotonic()
    report = run(args.specs, args.records, args.seed, args.only, on_finding=show)
    if report.caught:
        kinds = sorted({f.why.split(":", 2)[-1].strip()[:80] for f in report.caught})
        print(f"caught by the pass as unexpected: {len(report.caught)} ({len(kinds)} kinds)", flush=True)
    print(f"time: {time.monotonic() - started:.0f} s", flush=True)
    print(report.summary, flush=True)
    return 1 if report.unhandled else 0


if __name__ == "__main__":
    sys.exit(main())
