"""pathtune.runtime"""
