"""pathtune.codegen.triton"""
