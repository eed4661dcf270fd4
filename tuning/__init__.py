"""pathtune.tuning"""
