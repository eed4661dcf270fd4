"""pathtune.perf_db"""
