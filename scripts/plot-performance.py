#!/usr/bin/env python3
"""Draw the performance pictures (SVG, written by hand) from the benchmarks' JSON reports.

Usage:
    scripts/plot-performance.py [--out docs/img] [--note TEXT] REPORT.json [REPORT.json ...]

Python 3.11 standard library only. Each report is recognised by its shape:

- `dynamo-compare --trace --json` (`"benchmark": "dynamo-compare --trace"`, or `fleets[]` whose
  entries hold `indexers[]`): one panel per fleet size in `trace-throughput-latency.svg`,
  achieved block operations per second against query latency (p99 solid, p50 dashed), one line
  per index; a filled marker is a run that kept up, a hollow one a run that fell behind; each
  point is labelled with its speed.
- the load tool's `--mode trace --json` (`fleets[]` whose entries hold `runs[]` and
  `offline_hit_rate`): `trace-hit-rate.svg`, the hit rate per fleet size of the KV-aware router
  through the service (the run at the highest speed kept up, else the slowest run) beside the
  KV-aware router on the truth, round-robin and random without the service; and
  `trace-service-latency.svg`, the service's gRPC query latency against the replay speed.
- anything else (the side-by-side benchmark's report, whose shape may change): read tolerantly.
  Every object anywhere in the document that has a name (`name`, `indexer`, `index` or `side`)
  and either a list of points (`runs`, `points`, `results` or `speeds`) or numbers of its own
  is a series. A point's throughput is the first of `achieved_block_ops_per_s`,
  `block_ops_per_s`, `achieved_ops_per_s`, `ops_per_s`, `throughput`, `qps`,
  `requests_per_s` (at any depth in the point); its latency the first of `query_us`,
  `latency_us`, `query_latency_us` (objects with `p50`, `p99`), or `p50_us`/`p99_us`,
  `query_p50_us`/`query_p99_us`. Series without both are skipped with a note on stderr. They
  go to `<report name>-throughput-latency.svg`.

`--note` is printed under each picture's title (for example "smoke run, loaded 2-core machine").
"""

import argparse
import json
import math
import os
import sys

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
NAME_KEYS = ("name", "indexer", "index", "side")
POINT_LISTS = ("runs", "points", "results", "speeds")
THROUGHPUT_KEYS = (
    "achieved_block_ops_per_s",
    "block_ops_per_s",
    "achieved_ops_per_s",
    "ops_per_s",
    "throughput",
    "qps",
    "requests_per_s",
)
LATENCY_OBJECTS = ("query_us", "latency_us", "query_latency_us")
LATENCY_PAIRS = (("p50_us", "p99_us"), ("query_p50_us", "query_p99_us"))


def esc(text):
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def fmt(v):
    """A short number: 1.2k, 3.4M, 0.5."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:.3g}{suffix}"
    return f"{v:.3g}"


class Svg:
    def __init__(self, width, height):
        self.width, self.height, self.parts = width, height, []

    def add(self, s):
        self.parts.append(s)

    def text(self, x, y, s, size=12, anchor="start", color="#222", rotate=None, weight="normal"):
        rot = f' transform="rotate({rotate} {x:.1f} {y:.1f})"' if rotate else ""
        self.add(
            f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" '
            f'fill="{color}" font-weight="{weight}"{rot}>{esc(s)}</text>'
        )

    def line(self, x1, y1, x2, y2, color="#999", width=1, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.add(
            f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" '
            f'stroke="{color}" stroke-width="{width}"{d}/>'
        )

    def polyline(self, pts, color, width=2, dash=None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        p = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        self.add(f'<polyline points="{p}" fill="none" stroke="{color}" stroke-width="{width}"{d}/>')

    def circle(self, x, y, r, color, filled=True):
        fill = color if filled else "white"
        self.add(
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{r}" fill="{fill}" stroke="{color}" '
            f'stroke-width="1.5"/>'
        )

    def rect(self, x, y, w, h, color):
        self.add(f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{color}"/>')

    def write(self, path):
        head = (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" height="{self.height}" '
            f'viewBox="0 0 {self.width} {self.height}" font-family="sans-serif">\n'
            f'<rect width="100%" height="100%" fill="white"/>\n'
        )
        with open(path, "w", encoding="utf-8") as f:
            f.write(head + "\n".join(self.parts) + "\n</svg>\n")
        print(f"wrote {path}")


def log_ticks(lo, hi):
    """Ticks at 1, 2, 5 x powers of ten within [lo, hi] (fewer when the range is wide)."""
    ticks = []
    e = math.floor(math.log10(lo))
    steps = (1, 2, 5) if math.log10(hi / lo) < 3 else (1,)
    while 10**e <= hi * 1.0001:
        ticks += [m * 10**e for m in steps if lo * 0.9999 <= m * 10**e <= hi * 1.0001]
        e += 1
    return ticks


def log_range(values):
    lo, hi = min(values), max(values)
    lo, hi = 10 ** math.floor(math.log10(lo)), 10 ** math.ceil(math.log10(hi))
    return lo, hi if hi > lo else lo * 10


class Panel:
    """A log-log plot area at (x, y) of size (w, h)."""

    def __init__(self, svg, x, y, w, h, xs, ys, title, xlabel, ylabel):
        self.svg, self.x, self.y, self.w, self.h = svg, x, y, w, h
        self.xr, self.yr = log_range(xs), log_range(ys)
        svg.text(x + w / 2, y - 10, title, 13, "middle", weight="bold")
        svg.add(f'<rect x="{x}" y="{y}" width="{w}" height="{h}" fill="none" stroke="#444"/>')
        for t in log_ticks(*self.xr):
            px = self.px(t)
            svg.line(px, y, px, y + h, "#e4e4e4")
            svg.text(px, y + h + 15, fmt(t), 10, "middle")
        for t in log_ticks(*self.yr):
            py = self.py(t)
            svg.line(x, py, x + w, py, "#e4e4e4")
            svg.text(x - 5, py + 3, fmt(t), 10, "end")
        svg.text(x + w / 2, y + h + 32, xlabel, 11, "middle")
        svg.text(x - 42, y + h / 2, ylabel, 11, "middle", rotate=-90)

    def px(self, v):
        lo, hi = self.xr
        return self.x + self.w * (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))

    def py(self, v):
        lo, hi = self.yr
        return self.y + self.h * (1 - (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo)))

    def series(self, pts, color, dash=None, labels=None):
        """pts: (x, y, filled), joined in the order given. labels: text beside each point."""
        keep = [i for i, p in enumerate(pts) if p[0] > 0 and p[1] > 0]
        pts, labels = [pts[i] for i in keep], [labels[i] for i in keep] if labels else None
        if not pts:
            return
        xy = [(self.px(a), self.py(b)) for a, b, _ in pts]
        self.svg.polyline(xy, color, 2 if dash is None else 1.5, dash)
        for (px, py), (_, _, filled) in zip(xy, pts):
            self.svg.circle(px, py, 3.5, color, filled)
        for (px, py), label in zip(xy, labels or []):
            self.svg.text(px + 5, py - 5, label, 9, color=color)


def legend(svg, x, y, entries):
    """entries: (label, color, dash)."""
    for i, (label, color, dash) in enumerate(entries):
        yy = y + 16 * i
        svg.line(x, yy, x + 24, yy, color, 2, dash)
        svg.text(x + 30, yy + 4, label, 11)


def header(svg, title, note, source):
    svg.text(20, 24, title, 15, weight="bold")
    y = 42
    if note:
        svg.text(20, y, note, 12, color="#b00000")
        y += 16
    svg.text(20, y, f"from {source}", 10, color="#666")


def quantile(obj, q):
    v = obj.get(q) if isinstance(obj, dict) else None
    return v if isinstance(v, (int, float)) else None


# ---------------------------------------------------------------------------------------------
# dynamo-compare --trace


def is_trace_report(d):
    fleets = d.get("fleets") if isinstance(d, dict) else None
    return d.get("benchmark") == "dynamo-compare --trace" or (
        isinstance(fleets, list) and fleets and isinstance(fleets[0], dict) and "indexers" in fleets[0]
    )


def plot_trace(d, source, out, note):
    fleets = [f for f in d["fleets"] if f.get("indexers")]
    names = sorted({i["name"] for f in fleets for i in f["indexers"]}, key=lambda n: (n != "ours", n))
    color = {n: COLORS[i % len(COLORS)] for i, n in enumerate(names)}
    pw, ph, gap = 330, 260, 90
    svg = Svg(max(820, 80 + len(fleets) * (pw + gap)), ph + 250)
    header(svg, "Trace replay in process: achieved throughput against query latency", note, source)
    for k, f in enumerate(fleets):
        pts = [(r["achieved_block_ops_per_s"], r["query_us"][q]) for i in f["indexers"] for r in i["runs"] for q in ("p50", "p99")]
        pts = [p for p in pts if p[0] > 0 and p[1] > 0]
        if not pts:
            continue
        panel = Panel(
            svg, 70 + k * (pw + gap), 90, pw, ph, [p[0] for p in pts], [p[1] for p in pts],
            f"{f['engines']} engines", "achieved block ops/s (drain included)", "query latency, us",
        )
        for i in f["indexers"]:
            runs = sorted(i["runs"], key=lambda r: r["speed"])
            for q, dash in (("p99", None), ("p50", "5,3")):
                panel.series(
                    [(r["achieved_block_ops_per_s"], r["query_us"][q], r.get("kept_up", False)) for r in runs],
                    color[i["name"]], dash,
                    [f"x{r['speed']:g}" for r in runs] if q == "p99" else None,
                )
    entries = [(n, color[n], None) for n in names] + [("p99 (solid), p50 (dashed)", "#444", "5,3")]
    legend(svg, 70, ph + 150, entries)
    factor = d.get("keep_up_factor", "?")
    for j, line in enumerate((
        f"filled: kept up (every event applied within {factor} x the replay window); hollow: fell behind",
        "xN: replay speed; lines join an index's runs in order of speed",
        f"block ops: request hashes + stored + removed hashes; queries by keys computed ahead",
    )):
        svg.text(300, ph + 154 + 15 * j, line, 10, color="#444")
    svg.write(os.path.join(out, "trace-throughput-latency.svg"))


# ---------------------------------------------------------------------------------------------
# the load tool's --mode trace


def is_load_report(d):
    fleets = d.get("fleets") if isinstance(d, dict) else None
    return isinstance(fleets, list) and fleets and all("offline_hit_rate" in f for f in fleets)


def service_run(f):
    """The run at the highest speed kept up, else the slowest run."""
    runs = f.get("runs") or []
    if not runs:
        return None
    kept = [r for r in runs if r.get("keeps_up")]
    return max(kept, key=lambda r: r["speed"]) if kept else min(runs, key=lambda r: r["speed"])


def plot_hit_rate(d, source, out, note):
    fleets = d["fleets"]
    bars = [
        ("KV-aware, through the service", "#1f77b4"),
        ("KV-aware on the truth, no service", "#9ecae1"),
        ("round-robin", "#ff7f0e"),
        ("random", "#2ca02c"),
    ]
    values = []
    for f in fleets:
        r = service_run(f)
        off = f["offline_hit_rate"]
        values.append([
            r["hit_rate"] if r else None, off.get("kv-aware"), off.get("round-robin"), off.get("random"),
        ])
    top = max([v for row in values for v in row if v is not None] + [0.01])
    top = math.ceil(top * 20) / 20
    bw, gw = 38, 38 * len(bars) + 40
    x0, y0, h = 70, 90, 260
    svg = Svg(max(820, x0 + gw * len(fleets) + 260), y0 + h + 90)
    header(svg, "Prefix-cache hit rate on the conversation trace (cached prompt tokens / prompt tokens)", note, source)
    svg.add(f'<rect x="{x0}" y="{y0}" width="{gw * len(fleets)}" height="{h}" fill="none" stroke="#444"/>')
    for i in range(6):
        v = top * i / 5
        y = y0 + h - h * v / top
        svg.line(x0, y, x0 + gw * len(fleets), y, "#e4e4e4")
        svg.text(x0 - 5, y + 3, f"{v:.2f}", 10, "end")
    svg.text(x0 - 45, y0 + h / 2, "hit rate", 11, "middle", rotate=-90)
    for k, (f, row) in enumerate(zip(fleets, values)):
        gx = x0 + k * gw + 20
        for j, v in enumerate(row):
            if v is None:
                continue
            bh = h * v / top
            svg.rect(gx + j * bw, y0 + h - bh, bw - 4, bh, bars[j][1])
            svg.text(gx + j * bw + (bw - 4) / 2, y0 + h - bh - 4, f"{v:.3f}", 10, "middle")
        r = service_run(f)
        sub = f"speed x{r['speed']:g}" + ("" if r.get("keeps_up") else ", fell behind") if r else ""
        svg.text(gx + len(bars) * bw / 2, y0 + h + 16, f"{f['engines']} engines", 11, "middle")
        svg.text(gx + len(bars) * bw / 2, y0 + h + 30, sub, 9, "middle", color="#666")
    lx = x0 + gw * len(fleets) + 20
    for j, (label, c) in enumerate(bars):
        svg.rect(lx, y0 + 16 * j, 12, 12, c)
        svg.text(lx + 18, y0 + 16 * j + 10, label, 11)
    svg.write(os.path.join(out, "trace-hit-rate.svg"))


def plot_service_latency(d, source, out, note):
    fleets = [f for f in d["fleets"] if f.get("runs")]
    pts = [(r["speed"], r["query_us"][q]) for f in fleets for r in f["runs"] for q in ("p50", "p99")]
    pts = [p for p in pts if p[0] > 0 and p[1] > 0]
    if not pts:
        return
    svg = Svg(760, 420)
    header(svg, "Trace replay through the service: gRPC query latency against replay speed", note, source)
    panel = Panel(svg, 80, 90, 330, 260, [p[0] for p in pts], [p[1] for p in pts], "", "replay speed (x trace time)", "query latency, us")
    entries = []
    for k, f in enumerate(fleets):
        c = COLORS[k % len(COLORS)]
        for q, dash in (("p99", None), ("p50", "5,3")):
            panel.series([(r["speed"], r["query_us"][q], r.get("keeps_up", False)) for r in f["runs"]], c, dash)
        entries.append((f"{f['engines']} engines", c, None))
    legend(svg, 440, 100, entries + [("p99 solid, p50 dashed", "#444", "5,3")])
    svg.text(440, 100 + 16 * len(entries) + 24, "filled: kept up; hollow: not", 10, color="#444")
    svg.write(os.path.join(out, "trace-service-latency.svg"))


# ---------------------------------------------------------------------------------------------
# anything else: tolerant reading


def find_number(obj, keys, depth=0):
    if not isinstance(obj, dict) or depth > 3:
        return None
    for k in keys:
        if isinstance(obj.get(k), (int, float)):
            return obj[k]
    for v in obj.values():
        n = find_number(v, keys, depth + 1) if isinstance(v, dict) else None
        if n is not None:
            return n
    return None


def point_of(obj):
    """(throughput, p50, p99) of a point, or None."""
    tp = find_number(obj, THROUGHPUT_KEYS)
    lat = None
    for k in LATENCY_OBJECTS:
        if isinstance(obj.get(k), dict):
            lat = (quantile(obj[k], "p50"), quantile(obj[k], "p99"))
            break
    if lat is None:
        for a, b in LATENCY_PAIRS:
            if a in obj or b in obj:
                lat = (obj.get(a), obj.get(b))
                break
    if tp is None or lat is None or lat == (None, None):
        return None
    return tp, lat[0], lat[1], obj.get("kept_up", obj.get("keeps_up", True))


def find_series(obj, path, out):
    if isinstance(obj, dict):
        name = next((obj[k] for k in NAME_KEYS if isinstance(obj.get(k), str)), None)
        if name is not None:
            lists = [obj[k] for k in POINT_LISTS if isinstance(obj.get(k), list)]
            points = [p for lst in lists for p in (point_of(x) for x in lst if isinstance(x, dict)) if p]
            own = point_of(obj)
            points += [own] if own else []
            if points:
                out.append((f"{path}{name}", points))
            elif lists or any(k in obj for k in THROUGHPUT_KEYS):
                print(f"note: series {path}{name}: no throughput and latency found, skipped", file=sys.stderr)
        for k, v in obj.items():
            if isinstance(v, (dict, list)):
                find_series(v, f"{path}{k}/" if k not in POINT_LISTS else path, out)
    elif isinstance(obj, list):
        for v in obj:
            find_series(v, path, out)


def plot_generic(d, source, out, note):
    series = []
    find_series(d, "", series)
    series = [(n, pts) for n, pts in series if pts]
    if not series:
        print(f"note: {source}: no series with throughput and latency found", file=sys.stderr)
        return
    pts = [(p[0], v) for _, ps in series for p in ps for v in p[1:3] if isinstance(v, (int, float)) and v > 0]
    svg = Svg(760, 440 + 16 * max(0, len(series) - 8))
    header(svg, "Throughput against latency", note, source)
    panel = Panel(svg, 80, 90, 360, 260, [p[0] for p in pts], [p[1] for p in pts], "", "throughput (as reported)", "latency, us")
    entries = []
    for k, (name, ps) in enumerate(series):
        c = COLORS[k % len(COLORS)]
        for idx, dash in ((2, None), (1, "5,3")):
            panel.series([(p[0], p[idx], bool(p[3])) for p in ps if isinstance(p[idx], (int, float))], c, dash)
        entries.append((name, c, None))
    legend(svg, 470, 100, entries + [("p99 solid, p50 dashed", "#444", "5,3")])
    stem = os.path.splitext(os.path.basename(source))[0]
    svg.write(os.path.join(out, f"{stem}-throughput-latency.svg"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="+", help="JSON reports of the benchmarks")
    ap.add_argument("--out", default="docs/img", help="directory for the SVGs (docs/img)")
    ap.add_argument("--note", default="", help="a line under each title, e.g. 'smoke run'")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for path in a.reports:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        source = os.path.basename(path)
        if isinstance(d, dict) and is_trace_report(d):
            plot_trace(d, source, a.out, a.note)
        elif isinstance(d, dict) and is_load_report(d):
            plot_hit_rate(d, source, a.out, a.note)
            plot_service_latency(d, source, a.out, a.note)
        else:
            plot_generic(d, source, a.out, a.note)


if __name__ == "__main__":
    main()
