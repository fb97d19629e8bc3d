"""The throughput plot the benchmarks share: requests/s (top row) and p99
latency (bottom row) against concurrency, one column per payload, both
axes logarithmic. Needs matplotlib (Debian's python3-matplotlib)."""

import collections

# One line on every panel: `label` in the legend, `style` a matplotlib
# format string ("o-", "s--"), `color` None for the next default colour, and
# `points` {payload: [(concurrency, requests_per_s, p99_ms), ...]}.
Series = collections.namedtuple("Series", "label style color points")


def have_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def throughput_and_p99(path, payloads, concurrencies, series, title=None, column_width=4.2,
                       height=7.5):
    """Writes the plot to `path` (PNG). Returns False, writing nothing, when
    matplotlib is missing."""
    if not have_matplotlib():
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(2, len(payloads), figsize=(column_width * len(payloads), height),
                             squeeze=False)
    for column, payload in enumerate(payloads):
        for line in series:
            points = sorted(line.points.get(payload, []))
            if not points:
                continue
            xs = [c for c, _, _ in points]
            for row, values in ((0, [r for _, r, _ in points]), (1, [p for _, _, p in points])):
                axes[row][column].plot(xs, values, line.style, color=line.color,
                                       label=line.label)
        axes[0][column].set_title(payload)
        for row, ylabel in ((0, "requests/s"), (1, "p99 latency (ms)")):
            ax = axes[row][column]
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xticks(concurrencies)
            ax.set_xticklabels([str(c) for c in concurrencies])
            ax.grid(True, which="both", alpha=0.3)
            ax.set_xlabel("concurrency (requests in flight)")
            ax.set_ylabel(ylabel)
    axes[0][0].legend(loc="best", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
