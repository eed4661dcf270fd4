"""pathtune.runtime.reference"""
