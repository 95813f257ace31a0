"""The lane-dense per-sample "stats" array that every row kernel reads and writes.

Per-sample scalars travel as one (STATS_ROWS, B) float32 array, batch along the lanes:

    row SUM_ROW:     sum of squares (or of products, for row_dot)
    row NORM_ROW:    L2 norm, sqrt of the sum
    row PENALTY_ROW: the per-sample penalty
    other rows:      zero (padding to a full 8-sublane tile)
"""

STATS_ROWS = 8
SUM_ROW, NORM_ROW, PENALTY_ROW = 0, 1, 2
