"""PNG plots of a comparison: task-latency CDF, decode throughput and prefix hit rate over time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from services.common.extras import require
from services.sim.cluster.metrics import SessionOutcome, TimeSeries


def write_plots(
    out_dir: str | Path,
    latencies: Mapping[str, Sequence[SessionOutcome]],
    series: Mapping[str, TimeSeries],
    title: str = "",
) -> list[Path]:
    """Write latency_cdf.png, throughput.png, hit_rate.png into ``out_dir``; return the paths.
    Needs the 'report' extra (matplotlib)."""
    require("report", "PNG plots")
    import matplotlib

    matplotlib.use("Agg")  # no display; must precede pyplot
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, recs in latencies.items():
        xs = sorted(r.end_s - r.start_s for r in recs)
        if xs:
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            ax.step(xs, ys, where="post", label=name)
    ax.set_xlabel("task latency (s)")
    ax.set_ylabel("fraction of tasks")
    ax.set_title(f"Task latency CDF {title}".strip())
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    paths.append(out / "latency_cdf.png")
    fig.tight_layout()
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    for fname, attr, ylabel in (
        ("throughput.png", "decode_tokens_per_s", "decode tokens/s (output tokens per bin)"),
        ("hit_rate.png", "prefix_hit_rate", "prefix hit rate"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for name, ts in series.items():
            ax.plot(ts.t_s, getattr(ts, attr), label=name, linewidth=1.2)
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel(ylabel)
        bin_s = next(iter(series.values())).bin_s if series else 0
        ax.set_title(f"{ylabel} over time ({bin_s:g} s bins) {title}".strip())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        paths.append(out / fname)
        fig.tight_layout()
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths
