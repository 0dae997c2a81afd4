"""Turn a results JSON into the markdown table of bench/RESULTS.md and a PNG of achieved TB/s.

python -m bench.report bench/results/<file>.json [--png bench/results/<file>.png] [--md bench/RESULTS.md]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PEERS = ("tkaot", "torch", "tile_kernels")


def _cell(row: dict, peer: str, key: str, fmt: str) -> str:
    value = row.get(f"{peer}_{key}")
    if value is None:
        return "err" if f"{peer}_error" in row else "—"
    return format(value, fmt)


def table(result: dict) -> str:
    lines = [
        f"GPU {result['gpu']}, {result['date']}, torch {result['torch']}, copy ceiling {result['copy_ceiling_tbps']:.2f} TB/s",
        "",
        "| op | shape | tkaot µs | torch µs | TileKernels µs | tkaot TB/s | of ceiling | TileKernels TB/s | tkaot / TK time |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in result["rows"]:
        ratio = "—"
        if row.get("tkaot_us") and row.get("tile_kernels_us"):
            ratio = f"{row['tkaot_us'] / row['tile_kernels_us']:.2f}"
        lines.append(
            f"| {row['op']} | {row['shape']} | {_cell(row, 'tkaot', 'us', '.2f')} | {_cell(row, 'torch', 'us', '.2f')} | "
            f"{_cell(row, 'tile_kernels', 'us', '.2f')} | {_cell(row, 'tkaot', 'tbps', '.2f')} | "
            f"{_cell(row, 'tkaot', 'of_ceiling', '.0%')} | {_cell(row, 'tile_kernels', 'tbps', '.2f')} | {ratio} |"
        )
    host_rows = [r for r in result["rows"] if any(f"{p}_host_us" in r for p in PEERS)]
    if host_rows:
        lines += ["", "Host µs per call (1-token shapes, output allocation included):", ""]
        lines += ["| op | shape | tkaot | torch | TileKernels |", "| --- | --- | ---: | ---: | ---: |"]
        for r in host_rows:
            lines.append(
                f"| {r['op']} | {r['shape']} | {_cell(r, 'tkaot', 'host_us', '.2f')} | {_cell(r, 'torch', 'host_us', '.2f')} | "
                f"{_cell(r, 'tile_kernels', 'host_us', '.2f')} |"
            )
    if result.get("host"):
        lines += ["", "Launch-path anchors (host µs per call, same run):", ""]
        lines += [f"- {k.replace('_host_us', '')}: {v}" for k, v in result["host"].items()]
    if result.get("cold_start"):
        lines += ["", "Cold start (fresh process, beyond `import torch` + CUDA init):", ""]
        lines += [f"- {k}: {v}" for k, v in result["cold_start"].items()]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # bandwidth only means something for the large, memory-bound shapes
    rows = [r for r in result["rows"] if (r.get("tkaot_tbps") or 0) >= 0.1][::-1]
    labels = [f"{r['op']}  {r['shape']}" for r in rows]
    height = 0.27
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(rows) + 1.5))
    for i, peer in enumerate(PEERS):
        values = [r.get(f"{peer}_tbps") or 0 for r in rows]
        ax.barh([j + (1 - i) * height for j in range(len(rows))], values, height, label=peer.replace("_", ""))
    ceiling = result["copy_ceiling_tbps"]
    ax.axvline(ceiling, color="k", linestyle="--", linewidth=1, label=f"copy ceiling {ceiling:.2f}")
    ax.set_yticks(range(len(rows)), labels, fontsize=8)
    ax.set_xlim(0, ceiling * 1.08)
    ax.set_xlabel("achieved TB/s (fewest bytes moved / median device time)")
    ax.set_title(f"{result['gpu']}, {result['date']}: tkaot vs its peers, same run")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("results")
    parser.add_argument("--png")
    parser.add_argument("--md")
    args = parser.parse_args(argv)
    result = json.loads(Path(args.results).read_text())
    text = table(result)
    print(text)
    if args.png:
        try:
            plot(result, Path(args.png))
        except ImportError:
            print(f"matplotlib is not installed here: no {args.png}; run `python -m bench.report {args.results} --png ...` elsewhere")
    if args.md:
        head = "# Benchmark results\n\nRecorded by `make bench` (bench/run.py); raw numbers in bench/results/.\n\n"
        Path(args.md).write_text(f"{head}{text}\n")


if __name__ == "__main__":
    main()
