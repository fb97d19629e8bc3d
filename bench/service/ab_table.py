"""The table of bench/service/ab.sh's runs: per mode and point, each server's
median req/s, p50 and p99 over the rounds, and for each server the median
(and range) of its per-round req/s ratio to each server named by --ratio-to
(the same round's run: neighbours in time, as the rounds alternate).

  python3 -m bench.service.ab_table OUT/ab.txt --ratio-to base none

Prints Markdown; lines of failed runs ("client failed") are counted and listed.
"""
import argparse
import statistics
import sys
from collections import defaultdict


def read(path):
    """{(mode, point): {server: {round: (req_s, p50_ms, p99_ms, errors)}}}, and failures."""
    runs = defaultdict(lambda: defaultdict(dict))
    failed = []
    with open(path) as f:
        for line in f:
            fields = line.split()
            if len(fields) < 5:
                continue
            if "failed:" in fields or fields[4] == "client":
                failed.append(line.strip())
                continue
            round_, server, mode, point = fields[:4]
            numbers = [float(x) for x in fields[4:]]
            if len(numbers) == 3:  # req/s, p99, errors (lines written before p50 was)
                numbers = [numbers[0], float("nan"), numbers[1], numbers[2]]
            runs[(mode, point)][server][int(round_)] = tuple(numbers)
    return runs, failed


def table(runs, ratio_to):
    servers = sorted({s for point in runs.values() for s in point},
                     key=lambda s: (s in ratio_to, s))
    head = ["mode", "point", "server", "req/s", "p50 ms", "p99 ms", "errors"]
    head += [f"/ {r} (range)" for r in ratio_to]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (mode, point) in sorted(runs):
        by_server = runs[(mode, point)]
        for server in servers:
            rounds = by_server.get(server)
            if not rounds:
                continue
            med = [statistics.median(r[i] for r in rounds.values()) for i in range(3)]
            errors = int(sum(r[3] for r in rounds.values()))
            row = [mode, point, server, f"{med[0]:,.0f}", f"{med[1]:.2f}", f"{med[2]:.2f}", str(errors)]
            for ref in ratio_to:
                ratios = [rounds[i][0] / by_server[ref][i][0] for i in rounds
                          if ref != server and i in by_server.get(ref, {}) and by_server[ref][i][0]]
                row.append(f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
                           if ratios else "")
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ab_txt", help="the OUT/ab.txt that ab.sh appended to")
    parser.add_argument("--ratio-to", nargs="*", default=["none"],
                        help="servers to divide each server's req/s by, round by round")
    args = parser.parse_args(argv)
    runs, failed = read(args.ab_txt)
    rounds = sorted({i for p in runs.values() for s in p.values() for i in s})
    print(table(runs, args.ratio_to))
    print(f"\n{len(rounds)} rounds; medians over rounds; ratios of the same round's runs.")
    if failed:
        print(f"\n{len(failed)} runs failed:")
        for line in failed:
            print("    " + line)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
