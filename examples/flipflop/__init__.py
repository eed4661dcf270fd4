"""Flip-flop language modelling (FFL, path-math.md §3.1) with PaTH, RoPE and PaTH-FoX; see README.md."""
