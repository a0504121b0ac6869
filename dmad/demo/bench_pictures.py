"""The pictures of `dmad bench distill`: grid.png (prompts x models: the teacher, then each method's
final student at the fewest and the most steps) and grid_under.png ("a red shape" at 8 noise seeds
for each of them: a distribution, where a full caption has one right image). Both go in the
bench's output folder; docs/ holds the latest full bench's."""
from __future__ import annotations

from pathlib import Path

from dmad.demo.bench_sampling import load_student, sample_student, sample_teacher, student_timesteps_for


GRID_PROMPTS = 8
UNDER_GRID_CAPTION, UNDER_GRID_SEEDS = "a red shape", 8
SHEET = (185, 185, 185)  # unlike every demo background (black, gray 100, white)


def write_sheet(path: Path, tiles: list[list], column_labels: list[str], row_labels: list[str], scale: int = 2) -> None:
    """A labelled sheet of images: tiles[r][c] (3, H, W) arrays in [-1, 1], drawn `scale` times
    larger; a label above each column, one left of each row. Written atomically."""
    import numpy as np
    import textwrap
    from PIL import Image, ImageDraw

    from dmad.contract.runs import atomic_write_bytes
    from dmad.demo.shapes import png_bytes

    if not tiles or not tiles[0]:
        return
    side = tiles[0][0].shape[-1] * scale
    label_w, head_h, pad = 250, 18, 4
    sheet = Image.new("RGB", (label_w + len(column_labels) * (side + pad), head_h + len(tiles) * (side + pad)), SHEET)
    draw = ImageDraw.Draw(sheet)
    for c, label in enumerate(column_labels):
        draw.text((label_w + c * (side + pad), 3), label, fill=(0, 0, 0))
    for r, row in enumerate(tiles):
        y = head_h + r * (side + pad)
        draw.multiline_text((4, y + 4), "\n".join(textwrap.wrap(row_labels[r], 38)), fill=(0, 0, 0))
        for c, img in enumerate(row):
            arr = ((np.clip(np.asarray(img), -1, 1) + 1) * 127.5).round().astype(np.uint8).transpose(1, 2, 0)
            sheet.paste(Image.fromarray(arr).resize((side, side), Image.NEAREST), (label_w + c * (side + pad), y))
    atomic_write_bytes(path, png_bytes(sheet))


def write_grid(path: Path, grid: list, captions: list[str], seed: int, teachers: tuple, steps: tuple) -> None:
    """The bench's picture: one row per prompt (its first noise seed), one column per model: the
    `teachers` rows (RowKeys) first, then each method's final student (the peer's at DMAD's wall clock)
    of training seed `seed` at each of `steps`. `grid`: [(RowKey, images)] in the bench's order."""
    keep = [(key, img) for key, img in grid if key in teachers or _in_grid(key, seed, steps)]
    if keep:
        n = min(len(captions), *(len(img) for _, img in keep))
        tiles = [[img[r] for _, img in keep] for r in range(n)]
        labels = [key.group.replace(" + CFG", "+CFG") for key, _ in keep]
        write_sheet(path, tiles, labels, captions[:n])


def _in_grid(key, seed: int, steps: tuple) -> bool:
    return (key.model == "student" and key.seed == seed and key.budget in ("final", "same wall clock")
            and key.steps in steps)


def write_under_grid(b, path: Path, sset) -> None:
    """"a red shape" at UNDER_GRID_SEEDS noise seeds (columns): the teacher, then each method's final
    student of the first training seed at the most and the fewest steps (rows). A distribution,
    where the full-caption grid shows one right image per caption."""
    from dmad.demo.bench_rows import steps_label
    from dmad.demo.bench_runs import METHODS
    from dmad.demo.bench_sets import UNDER_INDEX, initial_noise
    from dmad.sample.render import latent_shape

    items = [(UNDER_GRID_CAPTION, UNDER_INDEX + 999, j) for j in range(UNDER_GRID_SEEDS)]
    caps = [c for c, _, _ in items]
    noise = initial_noise(items, sset.noise_a, latent_shape(b.teacher.vae, b.resolution, b.resolution))
    rows = [(f"teacher {b.s.teacher_steps} steps + CFG",
             sample_teacher(b.teacher, caps, noise, b.s.teacher_steps, b.cfg_scale, b.s.batch_size))]
    seed = b.s.training_seeds[0]
    for key in b.s.methods:
        run = b.result.runs.get(f"{key}-seed{seed}")
        final = next((r for r in b.result.rows if r.method == key and r.seed == seed
                      and r.budget in ("final", "same wall clock")), None)
        if run is None or final is None:
            continue
        ckpt = Path(run["run_dir"]) / "checkpoints" / f"iter_{final.iteration}"
        student, state = load_student(Path(run["run_dir"]), b.teacher, ckpt)
        for k in sorted({max(b.s.student_steps), min(b.s.student_steps)}, reverse=True):
            ts = student_timesteps_for(list(state.student_timesteps), k)
            rows.append((f"{METHODS[key].name} {steps_label(k)}",
                         sample_student(student, b.teacher, caps, noise, ts, b.s.batch_size, b.resolution)))
    write_sheet(path, [list(img.numpy()) for _, img in rows], [f"seed {j}" for j in range(UNDER_GRID_SEEDS)],
                [f"{label}: {UNDER_GRID_CAPTION}" for label, _ in rows])
