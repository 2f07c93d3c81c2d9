"""The capacity plot: job deadline-miss rate against offered load, per policy and seed, with the SLO line.

Every point a capacity search simulated is drawn (one line per policy and seed, in load
order); the bound's lower bound on the miss rate is the dashed black line; each policy's
legend entry carries its capacity at SLO (mean and range over the seeds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _label(name: str, summary: dict[str, Any]) -> str:
    c = summary["capacity"]
    return f"{name}: {c['mean']:.2f} [{c['min']:.2f}-{c['max']:.2f}]"


def plot_capacity(doc: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    fig, ax = plt.subplots(figsize=(7.2, 4.6))
    series: list[tuple[str, dict[str, Any], dict[str, str]]] = [(name, s, {}) for name, s in doc["policies"].items()]
    if "bound" in doc:
        series.append(("bound (lower bound on misses)", doc["bound"], {"color": "k", "ls": "--"}))
    for i, (name, summary, style) in enumerate(series):
        color = style.get("color", f"C{i}")
        for k, pts in enumerate(summary["points"].values()):
            pts = sorted(pts, key=lambda p: p["load"])
            ax.plot([p["load"] for p in pts], [p["miss_rate"] for p in pts], marker="o", ms=3, lw=1, alpha=0.8,
                    color=color, ls=style.get("ls", "-"), label=_label(name, summary) if k == 0 else None)
    ax.axhline(doc["slo"], color="r", lw=0.8, ls=":", label=f"SLO: miss rate {doc['slo']}")
    ax.set_xlabel("offered load (fraction of the fleet's fluid capacity)")
    ax.set_ylabel("job deadline-miss rate")
    worst = max((p["miss_rate"] for _, summary, _ in series for pts in summary["points"].values() for p in pts),
                default=1.0)
    ax.set_ylim(-0.02, min(1.02, max(worst, doc["slo"]) * 1.1 + 0.03))
    ax.set_title(f"{doc['workload']} on {doc['fleet']}: capacity at SLO (mean [range] over "
                 f"{len(doc['options']['seeds'])} seeds)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
