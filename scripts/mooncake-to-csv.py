#!/usr/bin/env python3
"""Converts a Mooncake FAST'25 trace (JSONL: timestamp in ms, input_length, output_length, hash_ids) into replay's
generic CSV (timestamp_s,tenant,input_tokens,output_tokens), one stream named after the workload.

    scripts/mooncake-to-csv.py conversation_trace.jsonl conversation > traces/mooncake-2025-conv.csv

Source: kvcache-ai/Mooncake, FAST25-release/traces/ (Apache-2.0; cite Qin et al., "Mooncake: Trading More Storage
for Less Computation", FAST 2025). The prefix hashes are dropped; rows keep the file's order.
"""
import json
import sys


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    path, stream = sys.argv[1], sys.argv[2]
    out = sys.stdout
    out.write("timestamp_s,tenant,input_tokens,output_tokens\n")
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                t, i, o = int(r["timestamp"]), int(r["input_length"]), int(r["output_length"])
            except (ValueError, KeyError, TypeError) as e:
                print(f"{path}:{n}: {e}", file=sys.stderr)
                return 1
            out.write(f"{t / 1000:.3f},{stream},{i},{o}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
