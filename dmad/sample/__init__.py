"""Images from a run: validation samples during training (render), `dmad sample` after it
(command), labelled grids (grid) and `dmad export` (export)."""
