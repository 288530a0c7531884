"""The papers' headline experiments run as ccoverlap comparisons (``ccoverlap reproduce``)."""
