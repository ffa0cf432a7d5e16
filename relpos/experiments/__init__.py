"""Running tables of (row, seed) experiments, collecting results, tables and plots."""
