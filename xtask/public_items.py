#!/usr/bin/env python3
"""Public items per crate, from rustdoc's JSON: the count behind "one way into each crate".

Usage (from the repository root; the JSON lands in target/doc/CRATE.json, and the CLI's binary and
the Python bindings' library are both called `tensora`, so document them one at a time and copy):

    cargo +nightly rustdoc -p tensora-io --lib -- -Z unstable-options --output-format json
    python3 xtask/public_items.py target/doc/tensora_io.json [more.json ...]

For each file: `public`, every item of the crate itself (crate_id 0) whose visibility is public,
reachable from the crate's root (rustdoc leaves out what is not), struct fields and `pub use`
re-exports included; `names`, the same without struct fields and `pub use` items (each name
defined once); then the count by kind.
"""

import collections
import json
import sys

NOT_NAMES = ("struct_field", "use")


def count(path: str) -> collections.Counter:
    with open(path) as f:
        doc = json.load(f)
    kinds = collections.Counter()
    for item in doc["index"].values():
        if item.get("crate_id") == 0 and item.get("visibility") == "public":
            kinds[next(iter(item["inner"]))] += 1
    return kinds


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    for path in sys.argv[1:]:
        kinds = count(path)
        total = sum(kinds.values())
        names = total - sum(kinds[k] for k in NOT_NAMES)
        by_kind = " ".join(f"{k}={v}" for k, v in sorted(kinds.items()))
        print(f"{path.rsplit('/', 1)[-1]:28} public={total:4} names={names:4}  {by_kind}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
