"""pathtune: compiler-driven kernel autotuner for PaTH attention."""
