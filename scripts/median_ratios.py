"""Summarises the alternated rounds of the writer-cost scripts (writer-cost.sh,
mariadb-writer-cost.sh, mariadb-trigger-cost.sh): reads lines `VARIANT TPS`, one per round,
and prints each variant's median and its share of the `naive` variant's median, with every
round's share beside it (rounds of one variant differ by up to 10%, so the spread is part of
the figure).

Usage: python3 scripts/median_ratios.py RESULTS_FILE
"""
import statistics
import sys

runs = {}
with open(sys.argv[1]) as results:
    for line in results:
        variant, tps = line.split()
        runs.setdefault(variant, []).append(float(tps))
naive = statistics.median(runs["naive"])
print("median tps, and as a share of the naive table's median (each round's share):")
for variant, tps in runs.items():
    m = statistics.median(tps)
    rounds = " ".join(f"{x / naive:.2f}" for x in tps)
    print(f"  {variant:<12} {m:10.0f}  {m / naive:5.2f}  ({rounds})")
