"""pathtune.specs"""
