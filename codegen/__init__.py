"""pathtune.codegen"""
