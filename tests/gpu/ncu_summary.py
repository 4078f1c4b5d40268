#!/usr/bin/env python3
"""Table of the last decode step in an Nsight Compute raw CSV (tests/gpu/profile_decode.sh).

usage: ncu_summary.py NCU_LOG (ncu --csv --page raw output; other lines are skipped)
The last decode step is the kernels from the last embedding kernel to the end. Prints one row per
kernel (duration, DRAM MB read, GB/s, grid, registers) and totals per kernel family.
"""
import csv
import re
import sys
from collections import defaultdict


def main() -> int:
    path = sys.argv[1]
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints its own notes before the table
    rows = list(csv.reader(lines))
    if len(rows) < 3:
        print(f"no kernels in {path}")
        return 1
    head = rows[0]
    col = {name: i for i, name in enumerate(head)}
    data = rows[2:]  # row 1: units

    def num(r, name):
        try:
            return float(r[col[name]].replace(",", ""))
        except (KeyError, ValueError):
            return 0.0

    start = max((i for i, r in enumerate(data) if "embedding" in r[col["Kernel Name"]]), default=0)
    step = data[start:]
    fam = defaultdict(lambda: [0, 0.0, 0.0])
    total_us = total_mb = 0.0
    print(f"{'#':>3} {'kernel':<58} {'us':>8} {'MB rd':>8} {'GB/s':>7} {'grid':>7} {'regs':>4}")
    for i, r in enumerate(step):
        name = r[col["Kernel Name"]]
        us = num(r, "gpu__time_duration.sum") / 1000.0  # ns -> us
        mb = num(r, "dram__bytes_read.sum") / 1e6
        grid = int(num(r, "launch__grid_size"))
        regs = int(num(r, "launch__registers_per_thread"))
        short = re.sub(r"\(.*", "", name)[:58]
        print(f"{i:>3} {short:<58} {us:>8.2f} {mb:>8.2f} {mb / us * 1e3 if us else 0:>7.0f} {grid:>7} {regs:>4}")
        key = re.sub(r"<.*", "", short)
        fam[key][0] += 1
        fam[key][1] += us
        fam[key][2] += mb
        total_us += us
        total_mb += mb
    print()
    print(f"{'family':<40} {'n':>4} {'us':>9} {'MB':>9} {'GB/s':>7}")
    for k, (n, us, mb) in sorted(fam.items(), key=lambda kv: -kv[1][1]):
        print(f"{k:<40} {n:>4} {us:>9.1f} {mb:>9.1f} {mb / us * 1e3 if us else 0:>7.0f}")
    print(f"{'TOTAL (serialised kernel time)':<40} {len(step):>4} {total_us:>9.1f} {total_mb:>9.1f} "
          f"{total_mb / total_us * 1e3 if total_us else 0:>7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
