"""The report of `dmad check-data`: the stable JSON (docs/check-data.md) built from the pass's
results (dmad.data.check calls build_report), and the human summary. The command's entry point,
which runs the pass and prints the summary, is dmad.data.check_command."""
from __future__ import annotations

import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from dmad.data.buckets import training_bucket
from dmad.data.check_items import CATEGORIES, severity

REPORT_VERSION = 1
SHOWN_PER_CATEGORY = 5  # paths listed per category in the human summary (the JSON has all)


def _caption_words(pair, entry) -> Optional[int]:
    if entry.caption_strategy == "instanceprompt":
        return len((entry.instance_prompt or "").split())
    if entry.caption_strategy == "filename":
        return len(pair.image.stem.replace("_", " ").replace("-", " ").split())
    return None if pair.caption_text is None else len(pair.caption_text.split())


def _word_stats(words: list[int]) -> Optional[dict]:
    if not words:
        return None
    return {"min": min(words), "max": max(words), "mean": round(statistics.fmean(words), 2),
            "median": statistics.median(words)}


def _buckets(pairs, entries, resolution: int, usable: set[str], batch: Optional[int]) -> list[dict]:
    counts: dict[tuple[int, int], list[int]] = {}
    for pair in pairs:
        if pair.info.size is None or any(p.category == "pixel_limit_exceeded" for p in pair.info.problems):
            continue
        e = entries[pair.dataset]  # the bucket training gives it (dmad.data.scan.scan_entry)
        key = training_bucket(*pair.info.size, e.target_resolution(resolution), e.step(resolution),
                              e.resolution_type, e.crop_aspect == "square", e.bucket_rounding)
        c = counts.setdefault(key, [0, 0])
        c[0] += 1
        c[1] += str(pair.image) in usable
    rows = [{"width": w, "height": h, "images": n, "usable": u, "full_batches": (u // batch) if batch else None}
            for (w, h), (n, u) in counts.items()]
    return sorted(rows, key=lambda r: (-r["images"], r["width"], r["height"]))


def build_report(*, source: Path, entries, pairs, problems, min_size: int, resolution: int,
                 batch: Optional[int], max_pixels: int) -> dict:
    """`problems`: (dataset id, Problem) tuples from every check."""
    order = {c: i for i, c in enumerate(CATEGORIES)}
    problems = sorted(problems, key=lambda dp: (dp[1].path, order[dp[1].category]))
    error_paths = {p.path for _, p in problems if severity(p.category) == "error"}
    usable = {str(p.image) for p in pairs if str(p.image) not in error_paths
              and (p.caption is None or str(p.caption) not in error_paths)}
    by_id = {e.id: e for e in entries}
    words = [w for p in pairs if str(p.image) in usable for w in [_caption_words(p, by_id[p.dataset])] if w is not None]
    counts = {c: 0 for c in CATEGORIES}
    for _, p in problems:
        counts[p.category] += 1
    datasets = []
    for e in entries:
        mine = [p for p in pairs if p.dataset == e.id]
        captioned = sum(1 for p in mine if e.caption_strategy != "textfile" or p.caption_text is not None)
        datasets.append({"id": e.id, "root": str(e.root), "images": len(mine),
                         "usable": sum(1 for p in mine if str(p.image) in usable), "captions": captioned})
    errors = sum(1 for _, p in problems if severity(p.category) == "error")
    return {
        "report_version": REPORT_VERSION, "source": str(Path(source).expanduser().resolve()),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "min_size": min_size, "resolution": resolution, "batch": batch, "max_pixels": max_pixels,
        "datasets": datasets,
        "problems": [{"category": p.category, "severity": severity(p.category), "path": p.path, "dataset": ds,
                      "detail": p.detail, "related": list(p.related)} for ds, p in problems],
        "counts": counts,
        "summary": {"images": len(pairs), "usable": len(usable), "errors": errors,
                    "warnings": len(problems) - errors, "caption_words": _word_stats(words),
                    "buckets": _buckets(pairs, by_id, resolution, usable, batch)},
        "clean": not problems,
    }


def format_summary(report: dict) -> str:
    s = report["summary"]
    lines = [f"Checked {s['images']} images in {len(report['datasets'])} dataset(s) from {report['source']}", ""]
    for d in report["datasets"]:
        lines.append(f"  {d['id']}: {d['usable']} of {d['images']} images usable, {d['captions']} captioned "
                     f"({d['root']})")
    found = [(c, n) for c, n in report["counts"].items() if n]
    if found:
        lines += ["", "Problems:"]
    for cat, n in found:
        sev, desc = CATEGORIES[cat]
        lines.append(f"  {cat} ({sev}, {n}): {desc}")
        mine = [p for p in report["problems"] if p["category"] == cat]
        lines += [f"    {p['path']}: {p['detail']}" for p in mine[:SHOWN_PER_CATEGORY]]
        if len(mine) > SHOWN_PER_CATEGORY:
            lines.append(f"    ... and {len(mine) - SHOWN_PER_CATEGORY} more (--json REPORT lists all)")
    cw = s["caption_words"]
    if cw:
        lines += ["", f"Caption words: min {cw['min']}, median {cw['median']}, mean {cw['mean']}, max {cw['max']}"]
    if s["buckets"]:
        batch = report["batch"]
        lines += ["", f"Buckets at resolution {report['resolution']}" + (f", batch {batch}:" if batch else ":")]
        for b in s["buckets"]:
            full = f", {b['full_batches']} full batches" if b["full_batches"] is not None else ""
            lines.append(f"  {b['width']}x{b['height']}: {b['images']} images, {b['usable']} usable{full}")
    if not s["images"]:
        lines += ["", "No images found (top level of each folder: .png .jpg .jpeg .webp .bmp)."]
    if report.get("mode") == "fast":
        skipped = ", ".join(report.get("skipped_checks") or ())
        lines += ["", f"Fast mode (header and file structure only, no pixels decoded): skipped {skipped}; "
                      "corruption inside the compressed data of a PNG with valid CRCs, or inside a JPEG's scan "
                      "data, is not detected (run without --fast for those)."]
    cache = report.get("cache") or {}
    if cache.get("reused"):
        lines += ["", f"{cache['reused']} of {s['images']} images unchanged since the last check: their results "
                      "came from the cache (--no-cache re-reads every file)."]
    lines += ["", "Clean: no problems found." if report["clean"] else
              f"{s['errors']} errors, {s['warnings']} warnings: {s['usable']} of {s['images']} images usable."]
    return "\n".join(lines)
